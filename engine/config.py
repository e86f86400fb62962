"""Every limit and interval of the engine, with its unit at the end of its name.

Defaults are embedded (RocketMQ's where RocketMQ has one); a TOML file may
override any of them::

    segment_size_bytes = 67108864
    flush_mode = "SYNC_FLUSH"

``StoreConfig.test_min()`` is the preset the tests use: tiny segments and
queue files so that every test rolls files.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from engine.store.layout import CQ_UNIT_BYTES, PROPERTIES_MAX_BYTES

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

FlushMode = Literal["ASYNC_FLUSH", "SYNC_FLUSH"]


class ConfigError(ValueError):
    """A configuration file or value is not acceptable."""


class StoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The engine's settings. Field names carry their unit; see docs/configuration.md."""

    # Where clients connect. Loopback only unless bind_non_loopback is set.
    endpoint: str = "tcp://127.0.0.1:10911"
    bind_non_loopback: bool = False
    # CURVE encryption and client authentication on the client endpoint (docs/protocol.md 1.6).
    # Paths are absolute, or relative to the config file's directory.
    curve_enabled: bool = False
    curve_server_secret_key_file: str = ""  # a secret certificate made by `python -m engine keygen`
    curve_authorized_keys_dir: str = ""  # the public certificates (*.key) of the clients allowed in
    # Host and port written into STOREHOST and message ids.
    store_host: str = "127.0.0.1"
    store_port: int = 10911

    # Files.
    segment_size_bytes: int = 1 * GiB
    consume_queue_file_units: int = 300_000
    index_hash_slot_count: int = 5_000_000
    index_item_count_max: int = 20_000_000
    warm_segments: bool = False

    # Messages.
    message_body_bytes_max: int = 4 * MiB
    properties_bytes_max: int = PROPERTIES_MAX_BYTES
    send_batch_bytes_max: int = 4 * MiB
    record_crc_enabled: bool = True
    topic_queue_count_default: int = 4
    topic_queue_count_max: int = 1024
    auto_create_topic: bool = True
    topic_count_max: int = 100_000  # the front's table and topics.json, rewritten whole on a change

    # Reads.
    pull_message_count_max: int = 1024
    pull_bytes_max: int = 4 * MiB
    query_result_count_max: int = 64
    consumer_offset_persist_interval_ms: int = 5_000
    consumer_offset_entries_max: int = 1_000_000  # (group, topic) pairs with committed offsets
    check_memory_bytes_max: int = 64 * MiB  # `engine check`: findings kept beyond the per-queue state
    long_poll_wait_ms_max: int = 30_000
    long_poll_parked_max: int = 100_000
    long_poll_wakes_per_turn_max: int = 512  # woken pulls an owner serves per loop turn; the rest next turn
    catch_up_bytes_per_turn_max: int = 16 * MiB  # log an owner or the index reads per turn to catch up

    # Pop consumers (docs/design.md 5.7): RabbitMQ's queue index per (group, topic, queue).
    pop_journal_entries_max: int = 65_536  # RabbitMQ's queue_index_max_journal_entries: fold past this
    pop_journal_idle_fold_ms: int = 5_000  # fold a queue's journal once it has been idle this long
    pop_invisible_ms_max: int = 12 * 3_600_000  # RocketMQ's longest invisible duration, 12 h
    max_delivery_attempts: int = 16  # RocketMQ's maxReconsumeTimes: then the message goes to %DLQ%{group}
    dead_letter_retry_ms: int = 1_000  # a dead-letter send the writer refused is tried again after this
    # Groups that consume in order (RocketMQ's consumeMessageOrderly): a queue gives such a group
    # its next message only once every earlier one is acked (docs/protocol.md 4.12).
    fifo_groups: tuple[str, ...] = ()

    # The RocketMQ 5 gRPC endpoint (docs/grpc.md): RocketMQ's proxy port, off unless grpc_enabled.
    grpc_enabled: bool = False
    grpc_endpoint: str = "127.0.0.1:8081"  # host:port; loopback only unless bind_non_loopback is set
    grpc_tls_cert_file: str = ""  # PEM certificate chain; with grpc_tls_key_file the port speaks TLS
    grpc_tls_key_file: str = ""
    grpc_curve_client_secret_key_file: str = ""  # with curve_enabled: the endpoint's own key to the front
    grpc_streams_max: int = 1_000  # calls open at once (each receive and telemetry stream is one)
    grpc_message_bytes_max: int = 4 * MiB + 64 * KiB  # the largest request the port takes
    grpc_request_timeout_ms: int = 10_000  # deadline of each request to the engine
    grpc_long_polling_ms: int = 20_000  # the long-polling time consumers are told to use
    grpc_invisible_ms_default: int = 60_000  # a push consumer's receive (auto_renew, no duration)
    # A push consumer's n-th redelivery after a failure waits the n-th delay (RocketMQ's levels from 1 s).
    grpc_retry_delays_ms: tuple[int, ...] = (1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000,
                                             300_000, 360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000,
                                             1_800_000, 3_600_000, 7_200_000)

    # Metrics and the dashboard (docs/metrics.md), served by the monitor actor; "" turns one off.
    metrics_endpoint: str = "127.0.0.1:9108"  # host:port of Prometheus' /metrics
    dashboard_endpoint: str = ""  # host:port of the web dashboard (which serves /metrics too)
    metrics_report_interval_ms: int = 1_000  # how often each actor writes its figures for the monitor

    # Delay and timer messages (docs/design.md 5.9): RocketMQ 5's timer wheel and timer log.
    timer_precision_ms: int = 1_000  # RocketMQ's timerPrecisionMs: one wheel slot; delivery within a slot is exact
    timer_max_delay_ms: int = 3 * 86_400_000  # RocketMQ's timerMaxDelaySec (3 days): further is DELAY_ILLEGAL
    timer_wheel_slots: int = 2 * 7 * 86_400  # RocketMQ's 2 x 7 days of 1 s slots (32 bytes each: 37 MiB)
    timer_log_segment_bytes: int = 52 * 1_048_576  # 2^20 timer-log units of 52 bytes per file
    timer_deliveries_in_flight_max: int = 64  # delivery sends (of up to 64 messages each) awaiting the front
    timer_checkpoint_interval_ms: int = 1_000
    # RocketMQ 4's delay levels 1..18 (messageDelayLevel); level n waits delay_levels_ms[n - 1].
    delay_levels_ms: tuple[int, ...] = (1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000,
                                        360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000,
                                        3_600_000, 7_200_000)

    # Transactional messages (docs/design.md 5.10): half messages, op records and the check service.
    transaction_timeout_ms: int = 6_000  # RocketMQ's transactionTimeOut: a half this old gets its first check
    transaction_check_interval_ms: int = 30_000  # RocketMQ's transactionCheckInterval: between two checks
    transaction_check_max: int = 15  # RocketMQ's transactionCheckMax: then the half is rolled back
    transaction_halves_max: int = 1_000_000  # unresolved halves the check service keeps in memory

    # Flushing and checkpoint (RocketMQ: 500 ms / 4 pages / 10 s; CQ 1 s).
    flush_mode: FlushMode = "ASYNC_FLUSH"
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    flush_consume_queue_interval_ms: int = 1_000
    checkpoint_interval_ms: int = 1_000
    sync_flush_timeout_ms: int = 5_000

    # Retention (RocketMQ: 72 h, "04", 75 % / 85 % / 90 %, every 10 s).
    file_reserved_time_hours: float = 72.0
    delete_when_hours: str = "04"
    disk_max_used_space_ratio: float = 0.75
    disk_space_clean_forcibly_ratio: float = 0.85
    # Off: a full disk refuses sends (DISK_FULL) and keeps every unexpired message.
    # On (RocketMQ's behaviour): past disk_space_clean_forcibly_ratio the oldest segments
    # go even if unexpired; each one is logged and counted with its messages and times.
    disk_space_clean_forcibly: bool = False
    disk_space_warning_level_ratio: float = 0.90
    clean_resource_interval_ms: int = 10_000
    delete_segment_count_max: int = 10

    # Flow control (RocketMQ: waitTimeMillsInSendQueue = 200 ms).
    send_queue_wait_ms_max: int = 200
    writer_queue_requests_max: int = 256

    # Actors.
    consume_queue_owner_count: int = 2
    dispatch_batch_records_max: int = 1_000
    dispatch_batches_per_turn_max: int = 64  # the reput dispatcher publishes at most this many per loop turn
    dispatch_tick_interval_ms: int = 100
    heartbeat_interval_ms: int = 200
    heartbeat_timeout_ms: int = 5_000
    actor_start_timeout_ms: int = 30_000
    actor_stop_timeout_ms: int = 10_000
    restart_count_max: int = 5
    restart_window_ms: int = 60_000
    restart_backoff_ms: int = 100
    socket_hwm_messages: int = 10_000
    client_frame_bytes_max: int = 4 * MiB + 64 * KiB

    # Logs (docs/configuration.md 2.8): each process writes STORE/logs/<name>.log, rotated by size.
    log_format: Literal["text", "json"] = "text"  # "json": one object per line, with an event field for events
    log_file_bytes_max: int = 64 * MiB  # a log file past this size is renamed <name>.log.1 (older ones shift)
    log_files_kept: int = 5  # files per log, the live one included; the oldest is deleted

    def validate(self) -> StoreConfig:
        """Check relationships between fields; raise ConfigError naming the field."""
        checks = [
            (self.segment_size_bytes >= 4 * KiB, "segment_size_bytes must be at least 4096"),
            (self.segment_size_bytes % 4096 == 0, "segment_size_bytes must be a multiple of 4096"),
            (self.message_body_bytes_max + self.properties_bytes_max + 1 * KiB <= self.segment_size_bytes,
             "segment_size_bytes must hold the largest record (message_body_bytes_max + properties_bytes_max "
             "+ 1 KiB of header and topic)"),
            (self.message_body_bytes_max >= 1, "message_body_bytes_max must be positive"),
            (self.send_batch_bytes_max >= 1, "send_batch_bytes_max must be positive"),
            (min(self.flush_interval_ms, self.flush_consume_queue_interval_ms, self.checkpoint_interval_ms,
                 self.heartbeat_interval_ms, self.dispatch_tick_interval_ms) >= 1, "intervals must be positive"),
            (self.pull_message_count_max >= 1 and self.pull_bytes_max >= 1, "pull limits must be positive"),
            (self.consume_queue_file_units >= 1, "consume_queue_file_units must be positive"),
            (self.index_hash_slot_count >= 1, "index_hash_slot_count must be positive"),
            (self.index_item_count_max >= 2, "index_item_count_max must be at least 2"),
            (0 < self.properties_bytes_max <= PROPERTIES_MAX_BYTES, "properties_bytes_max is at most 32767"),
            (1 <= self.consume_queue_owner_count <= 256, "consume_queue_owner_count must be between 1 and 256"),
            (_is_ip(self.store_host), "store_host must be an IPv4 or IPv6 address (it is written into records)"),
            (is_endpoint(self.endpoint), f"endpoint {self.endpoint!r} must be tcp://host:port or ipc://path"),
            (1 <= self.topic_queue_count_default <= self.topic_queue_count_max,
             "topic_queue_count_default must be between 1 and topic_queue_count_max"),
            (self.client_frame_bytes_max >= self.send_batch_bytes_max + 64 * KiB,
             "client_frame_bytes_max must exceed send_batch_bytes_max by 64 KiB"),
            (self.restart_count_max >= 0, "restart_count_max must not be negative"),
            (min(self.pop_journal_entries_max, self.pop_journal_idle_fold_ms, self.pop_invisible_ms_max,
                 self.max_delivery_attempts, self.dead_letter_retry_ms) >= 1, "pop limits must be positive"),
            (min(self.long_poll_wakes_per_turn_max, self.catch_up_bytes_per_turn_max,
                 self.dispatch_batches_per_turn_max) >= 1, "the per-turn limits must be positive"),
            (0 < self.disk_max_used_space_ratio <= self.disk_space_clean_forcibly_ratio
             <= self.disk_space_warning_level_ratio <= 1,
             "disk ratios must satisfy 0 < max_used <= clean_forcibly <= warning_level <= 1"),
            (self.file_reserved_time_hours >= 0, "file_reserved_time_hours must not be negative"),
            (self.bind_non_loopback or is_loopback_endpoint(self.endpoint),
             f"endpoint {self.endpoint} is not a loopback address; set bind_non_loopback = true to serve other "
             f"machines (and consider curve_enabled)"),
            (not self.curve_enabled or (self.curve_server_secret_key_file and self.curve_authorized_keys_dir),
             "curve_enabled needs curve_server_secret_key_file and curve_authorized_keys_dir"),
            (_GRPC_ENDPOINT.fullmatch(self.grpc_endpoint) is not None,
             f"grpc_endpoint {self.grpc_endpoint!r} must be host:port"),
            (self.bind_non_loopback or is_loopback_endpoint(f"tcp://{self.grpc_endpoint}"),
             f"grpc_endpoint {self.grpc_endpoint} is not a loopback address; set bind_non_loopback = true to serve "
             f"other machines (and consider grpc_tls_cert_file)"),
            (bool(self.grpc_tls_cert_file) == bool(self.grpc_tls_key_file),
             "grpc_tls_cert_file and grpc_tls_key_file go together"),
            (not (self.grpc_enabled and self.curve_enabled) or self.grpc_curve_client_secret_key_file,
             "grpc_enabled with curve_enabled needs grpc_curve_client_secret_key_file (a key the front allows)"),
            (min(self.grpc_streams_max, self.grpc_message_bytes_max, self.grpc_request_timeout_ms,
                 self.grpc_invisible_ms_default) >= 1 and self.grpc_long_polling_ms >= 0,
             "grpc limits must be positive"),
            (bool(self.grpc_retry_delays_ms) and min(self.grpc_retry_delays_ms) >= 0,
             "grpc_retry_delays_ms needs at least one delay, none negative"),
            *_http_endpoint_checks("metrics_endpoint", self.metrics_endpoint, self.bind_non_loopback),
            *_http_endpoint_checks("dashboard_endpoint", self.dashboard_endpoint, self.bind_non_loopback),
            (not self.metrics_endpoint or self.metrics_endpoint != self.dashboard_endpoint,
             "metrics_endpoint and dashboard_endpoint must differ (the dashboard serves /metrics too)"),
            (self.metrics_report_interval_ms >= 1, "metrics_report_interval_ms must be positive"),
            (min(self.timer_precision_ms, self.timer_wheel_slots, self.timer_deliveries_in_flight_max,
                 self.timer_checkpoint_interval_ms, self.timer_max_delay_ms) >= 1, "timer limits must be positive"),
            (self.timer_max_delay_ms < 2**31 - 2 * self.timer_precision_ms,
             "timer_max_delay_ms must be below 2^31 ms (24.8 days): a timer unit holds the delay in 32 bits"),
            (self.timer_wheel_slots * self.timer_precision_ms >= 2 * self.timer_max_delay_ms,
             "the timer wheel must span twice timer_max_delay_ms (timer_wheel_slots x timer_precision_ms)"),
            (self.timer_log_segment_bytes >= 52 * 64 and self.timer_log_segment_bytes % 52 == 0,
             "timer_log_segment_bytes must be a multiple of 52 (the unit), at least 64 units"),
            (bool(self.delay_levels_ms) and min(self.delay_levels_ms) >= 1,
             "delay_levels_ms needs at least one level, each positive"),
            (min(self.transaction_timeout_ms, self.transaction_check_interval_ms, self.transaction_check_max,
                 self.transaction_halves_max) >= 1, "transaction limits must be positive"),
            (self.log_format in ("text", "json"), 'log_format must be "text" or "json"'),
            (self.log_file_bytes_max >= 4 * KiB, "log_file_bytes_max must be at least 4096"),
            (self.log_files_kept >= 2, "log_files_kept must be at least 2 (the live file and one rotated file)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self

    @property
    def consume_queue_file_bytes(self) -> int:
        return self.consume_queue_file_units * CQ_UNIT_BYTES

    def replace(self, **changes: object) -> StoreConfig:
        return msgspec.structs.replace(self, **changes).validate()

    @classmethod
    def test_min(cls) -> StoreConfig:
        """Small files so that tests roll segments, queue files and index files."""
        return cls(
            segment_size_bytes=8 * MiB,
            consume_queue_file_units=1_000,
            index_hash_slot_count=1_000,
            index_item_count_max=4_000,
            message_body_bytes_max=4 * MiB,
            flush_interval_ms=50,
            flush_consume_queue_interval_ms=100,
            checkpoint_interval_ms=100,
            heartbeat_interval_ms=100,
            timer_max_delay_ms=3_600_000,  # a wheel of 2 h (225 KiB), not 2 weeks (37 MiB)
            timer_wheel_slots=7_200,
            timer_log_segment_bytes=52 * 4_096,
            metrics_endpoint="",  # engines of tests that do not look at metrics need no monitor
        ).validate()

    @classmethod
    def load(cls, path: str | Path | None, **overrides: object) -> StoreConfig:
        """Defaults, then the TOML file at ``path`` (if any), then ``overrides``."""
        values: dict[str, object] = {}
        if path is not None:
            try:
                values.update(tomllib.loads(Path(path).read_text()))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"cannot read config {path}: {exc}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        base = Path(path).resolve().parent if path is not None else Path.cwd()
        for key in ("curve_server_secret_key_file", "curve_authorized_keys_dir", "grpc_tls_cert_file",
                    "grpc_tls_key_file", "grpc_curve_client_secret_key_file"):
            value = values.get(key)
            if isinstance(value, str) and value:
                values[key] = str(base / Path(value).expanduser())  # an absolute path stays as it is
        try:
            return msgspec.convert(values, cls).validate()
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid config: {exc}") from exc

    def to_toml_dict(self) -> dict[str, object]:
        return msgspec.structs.asdict(self)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ``ipc://``/``inproc://`` endpoints and ``tcp://`` ones bound to a loopback address."""
    import ipaddress

    if not endpoint.startswith("tcp://"):
        return endpoint.startswith(("ipc://", "inproc://"))
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name or a host name: not known to be loopback


def _is_ip(host: str) -> bool:
    """A dotted quad, or an IPv6 address (written as RocketMQ writes an IPv6 host: 16 bytes and
    SYSFLAG 0x20), and nothing else (``inet_aton`` also takes "127.1" and "127.0.0.1 junk")."""
    import ipaddress

    for kind in (ipaddress.IPv4Address, ipaddress.IPv6Address):
        try:
            kind(host)
        except ValueError:
            continue
        return True
    return False


# tcp://host:port (host a name, an IPv4 address, [IPv6] or *) or ipc://path; a full match.
_ENDPOINT = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.*-]+):[0-9]{1,5}|ipc://[^\s\x00]+", re.ASCII)


_GRPC_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}", re.ASCII)


def _http_endpoint_checks(key: str, value: str, bind_non_loopback: bool) -> list[tuple[bool, str]]:
    """An HTTP endpoint of the monitor: "" (off) or host:port, on loopback unless allowed otherwise."""
    if not value:
        return []
    return [(_GRPC_ENDPOINT.fullmatch(value) is not None, f"{key} {value!r} must be host:port"),
            (bind_non_loopback or is_loopback_endpoint(f"tcp://{value}"),
             f"{key} {value} is not a loopback address; set bind_non_loopback = true to serve other machines")]


def is_endpoint(endpoint: str) -> bool:
    return _ENDPOINT.fullmatch(endpoint) is not None


def encode_config(config: StoreConfig) -> bytes:
    """Serialise a config to hand it to an actor process."""
    return msgspec.json.encode(config)


def decode_config(data: bytes | str) -> StoreConfig:
    return msgspec.json.decode(data, type=StoreConfig).validate()
