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

from engine.layout import CQ_UNIT_BYTES, PROPERTIES_MAX_BYTES

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
    # Who may do what (docs/security.md): users and policies in STORE/config/acl.json, checked where
    # a request enters (the gRPC endpoint: its calls' signatures, then the policies).
    acl_enabled: bool = False
    acl_signature_skew_ms_max: int = 900_000  # a signed call's date at most this far from the clock (15 min)
    # The replication channel's key pair (`rmqpy keygen`): with it the channel is encrypted and only the
    # set's members take part (docs/security.md). Without replication_curve_authorized_keys_dir it is
    # the set's one key, the same file on every engine of the set; with it, this engine's own, and the
    # directory holds each member's public key as member-<broker_id>.key.
    replication_curve_secret_key_file: str = ""
    replication_curve_authorized_keys_dir: str = ""
    replica_of_broker_id: int = 0  # the broker_id of the master replica_of names (set from the role when elected)
    # The writer and the owners answer a client that asks (StoreClient) straight, past the front:
    # each binds a port of its own on the front's host (engine/ipc/direct_replies.py).
    direct_replies_enabled: bool = True
    # ... and the writer takes sends straight from such a client (client -> writer -> client), checked
    # over the topic table the front saved (engine/services/writer/direct_sends.py); off with acl_enabled.
    direct_sends_enabled: bool = True
    # Host and port written into STOREHOST and message ids.
    store_host: str = "127.0.0.1"
    store_port: int = 10911

    # Files.
    segment_size_bytes: int = 1 * GiB
    consume_queue_file_units: int = 300_000
    index_hash_slot_count: int = 5_000_000
    index_item_count_max: int = 20_000_000
    warm_segments: bool = False
    # RocketMQ indexes every message's UNIQ_KEY (its client id) beside its KEYS. Off, a message
    # without KEYS costs the index builder nothing, and a lookup by a UNIQ_KEY (query_by_key
    # with it) finds nothing; lookups by KEYS and by offset message id (get_by_id) work as before.
    index_uniq_key_enabled: bool = True

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
    query_keys_per_request_max: int = 1_000  # keys of one query_by_keys
    consumer_offset_persist_interval_ms: int = 5_000
    consumer_offset_entries_max: int = 1_000_000  # (group, topic) pairs with committed offsets
    # A member of a group sharing queues that sends no heartbeat for this long is gone (its queues move).
    consumer_session_timeout_ms: int = 6_000
    consumer_group_members_max: int = 100_000  # live members of all groups sharing queues
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
    # With TLS: clients must show a certificate this CA signed (mutual TLS); with acl_enabled its
    # common name names a user (tls_common_name) when a call carries no signature
    grpc_tls_client_ca_file: str = ""
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

    # The monitor's HTTP ports (metrics and dashboard, each its own): bounded, so a burst of
    # connections cannot starve the monitor of its heartbeat (docs/metrics.md, "Limits").
    http_connections_max: int = 64  # connections open at once a port; past it the oldest half-read one is dropped
    http_request_timeout_ms: int = 5_000  # a request must arrive whole within this, and each send of its answer
    http_workers_max: int = 4  # requests answered at once a port; the others wait their turn

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

    # Replication (docs/replication.md): RocketMQ's master/slave HA. A master with a
    # replication_endpoint streams its log to the replicas that connect there; an engine with
    # replica_of (that endpoint of its master) appends only what its master sends, dispatches
    # it itself, serves reads, and refuses writes (NOT_MASTER).
    replication_endpoint: str = ""  # tcp://host:port a master listens on for replicas ("" : none)
    replica_of: str = ""  # tcp://host:port of the master's replication_endpoint ("" : this engine is a master)
    replication_chunk_bytes_max: int = 256 * KiB  # log bytes in one message to a replica (whole records)
    replication_chunks_in_flight_max: int = 4  # sent to a replica and not yet reported written by it
    replication_report_interval_ms: int = 1_000  # a replica reports its end at least this often
    replication_config_interval_ms: int = 1_000  # how often a master sends changed topics and offsets files
    # A replica whose connection breaks leaves its master's in-sync set at once (the master's socket
    # monitor). ZMTP heartbeats (a ping every quarter of it) close a link that stays silent this long
    # at both ends: a replica paused or cut off leaves the set within it. replica_silence_ms_max is for
    # a replica whose link lives but that stops reporting (its supervisor kills an actor that hangs).
    replication_heartbeat_timeout_ms: int = 1_000
    replica_silence_ms_max: int = 10_000  # a replica not heard from for this long is dropped by its master
    # "SYNC": a send is answered once every in-sync replica holds it (FLUSH_SLAVE_TIMEOUT after
    # sync_flush_timeout_ms), and refused (SLAVE_NOT_AVAILABLE) while fewer than min_in_sync_replicas
    # are in sync; readers see only what the in-sync replicas hold. "ASYNC": answered as flush_mode says.
    # It applies to a master (replication_endpoint); a replica follows its master's.
    replication_mode: Literal["ASYNC", "SYNC"] = "ASYNC"
    min_in_sync_replicas: int = 1
    replica_lag_max_ms: int = 15_000  # RocketMQ's haMaxTimeSlaveNotCatchup: out of sync past this behind

    # Election on etcd (docs/replication.md "Failover"): with etcd_endpoints, the engines of one
    # broker set (cluster_name, broker_name; broker_id tells them apart) choose their master there,
    # as RocketMQ 5's controller mode does. Each has a replication_endpoint (where it listens while
    # master); the one elected serves writes, the others follow it. The master holds a lease of
    # master_lease_ms and stops accepting writes master_fence_margin_ms before it could run out.
    etcd_endpoints: str = ""  # http://host:port[,http://host:port...] ("" : roles from replica_of, no election)
    cluster_name: str = "DefaultCluster"  # RocketMQ's brokerClusterName
    broker_name: str = "broker-a"  # RocketMQ's brokerName: the broker set
    broker_id: int = 0  # this engine within its broker set (0..62)
    master_lease_ms: int = 2_000  # etcd lease of the master (whole seconds: etcd's unit)
    master_fence_margin_ms: int = 500  # writes stop this long before the lease could expire unrenewed
    election_wait_ms: int = 300  # candidates wait this long for each other's offers before the best one claims
    etcd_request_timeout_ms: int = 500  # one etcd request, before the next endpoint is tried
    # TLS to etcd (https:// endpoints whose members ask for client certificates): the CA of the
    # members' certificates, and this engine's certificate and key (docs/security.md)
    etcd_tls_ca_file: str = ""
    etcd_tls_cert_file: str = ""
    etcd_tls_key_file: str = ""
    # etcd's own user (etcd with auth enabled): its name, and a file holding its password (docs/security.md)
    etcd_user: str = ""
    etcd_password_file: str = ""
    cluster_routes_refresh_ms: int = 2_000  # how often each engine mirrors the cluster's topic routes from etcd
    # A replica keeps a master's actor processes spawned and waiting (about 30 MB each): a promotion
    # does not wait for eleven interpreters to start (1.2 s on two cores).
    standby_master_actors: bool = True

    # Flushing and checkpoint (RocketMQ: 500 ms / 4 pages / 10 s; CQ 1 s).
    flush_mode: FlushMode = "ASYNC_FLUSH"
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    flush_consume_queue_interval_ms: int = 1_000
    checkpoint_interval_ms: int = 1_000
    sync_flush_timeout_ms: int = 5_000
    # SYNC_FLUSH: the writer syncs a run of sends in its own loop, without waking its flush thread,
    # when that thread is idle and the last wait for a sync took at most this long (-1: always the thread).
    writer_sync_in_loop_ms_max: int = 2

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

    # Disk footprint (docs/configuration.md 2.9). Files keep RocketMQ's sizes (a 1 GiB segment is
    # 1 GiB long) but are sparse: real blocks are reserved with fallocate ahead of the writes, in
    # steps that double from one page up to these, so a full disk is an ENOSPC error, never a
    # SIGBUS. ``profile = "dev"`` (in a config file) starts from DEV_PROFILE's smaller files.
    profile: Literal["default", "dev"] = "default"
    segment_reserve_step_bytes: int = 16 * MiB  # CommitLog segments
    consume_queue_reserve_step_bytes: int = 64 * KiB  # ConsumeQueue files (3,276 units)
    index_reserve_step_bytes: int = 4 * MiB  # the IndexFile's items (its header and slots are reserved whole)
    timer_reserve_step_bytes: int = 1 * MiB  # timer-log files
    auto_create_topics_max: int = 1_000  # a send creates a missing topic only while fewer topics exist

    # Logs (docs/configuration.md 2.8): each process writes STORE/logs/<name>.log, rotated by size.
    log_format: Literal["text", "json"] = "text"  # "json": one object per line, with an event field for events
    log_file_bytes_max: int = 64 * MiB  # a log file past this size is renamed <name>.log.1 (older ones shift)
    log_files_kept: int = 5  # files per log, the live one included; the oldest is deleted
    audit_log_bytes_max: int = 64 * MiB  # STORE/logs/audit-<process>.jsonl past this is renamed .1 (and so on)
    audit_log_files_kept: int = 5  # rotated audit files kept besides the live one

    @property
    def is_replica(self) -> bool:
        return bool(self.replica_of)

    @property
    def sync_replication(self) -> bool:
        """A master whose sends wait for its in-sync replicas."""
        return self.replication_mode == "SYNC" and bool(self.replication_endpoint) and not self.is_replica

    @property
    def advertised_endpoint(self) -> str:
        """Where this engine's clients reach it, as it tells others (RocketMQ's brokerIP1 and port)."""
        host = f"[{self.store_host}]" if ":" in self.store_host else self.store_host
        return f"tcp://{host}:{self.store_port}"

    @property
    def reads_wait_for_replicas(self) -> bool:
        """Readers see only what every in-sync replica holds: a SYNC master's, and its replicas' (they
        learn it from the master: ``ConfirmOffset``)."""
        return self.replication_mode == "SYNC" and (self.is_replica or bool(self.replication_endpoint))

    @property
    def elected(self) -> bool:
        """Its role is chosen on etcd (``etcd_endpoints``), not by ``replica_of``."""
        return bool(self.etcd_endpoints)

    @property
    def etcd_endpoint_list(self) -> list[str]:
        return [url.strip() for url in self.etcd_endpoints.split(",") if url.strip()]

    def validate(self) -> StoreConfig:
        """Check relationships between fields; raise ConfigError naming the field."""
        checks = [
            *self._minimum_checks(),
            (self.segment_size_bytes % 4096 == 0,
             f"segment_size_bytes must be a multiple of 4096 (got {self.segment_size_bytes})"),
            (self.message_body_bytes_max + self.properties_bytes_max + 1 * KiB <= self.segment_size_bytes,
             f"segment_size_bytes ({self.segment_size_bytes}) must hold the largest record (message_body_bytes_max "
             f"{self.message_body_bytes_max} + properties_bytes_max {self.properties_bytes_max} "
             f"+ 1 KiB of header and topic)"),
            (self.properties_bytes_max <= PROPERTIES_MAX_BYTES,
             f"properties_bytes_max must be at most {PROPERTIES_MAX_BYTES} (got {self.properties_bytes_max})"),
            (self.consume_queue_owner_count <= 256,
             f"consume_queue_owner_count must be between 1 and 256 (got {self.consume_queue_owner_count})"),
            (self.store_port <= 65535, f"store_port must be between 1 and 65535 (got {self.store_port})"),
            (_is_ip(self.store_host),
             f"store_host must be an IPv4 or IPv6 address (it is written into records; got {self.store_host!r})"),
            (is_endpoint(self.endpoint), f"endpoint must be tcp://host:port or ipc://path (got {self.endpoint!r})"),
            (not (self.replication_endpoint and self.replica_of) or bool(self.etcd_endpoints),
             "an engine is a master (replication_endpoint) or a replica (replica_of), not both, unless elected "
             "on etcd (etcd_endpoints)"),
            (not self.etcd_endpoints or self.replication_endpoint.startswith("tcp://"),
             "an engine elected on etcd (etcd_endpoints) needs the replication_endpoint it serves while master"),
            (bool(self.etcd_user) == bool(self.etcd_password_file),
             "etcd_user and etcd_password_file go together"),
            (bool(self.etcd_tls_ca_file) == bool(self.etcd_tls_cert_file) == bool(self.etcd_tls_key_file),
             "etcd_tls_ca_file, etcd_tls_cert_file and etcd_tls_key_file go together"),
            (not self.etcd_tls_ca_file or all(url.startswith("https://") for url in self.etcd_endpoint_list),
             f"with etcd_tls_ca_file, etcd_endpoints must be https:// (got {self.etcd_endpoints!r})"),
            (all(url.startswith(("http://", "https://")) for url in self.etcd_endpoint_list),
             f"etcd_endpoints must be http://host:port, separated by commas (got {self.etcd_endpoints!r})"),
            (0 <= self.broker_id <= 62, f"broker_id must be between 0 and 62 (got {self.broker_id})"),
            (0 <= self.replica_of_broker_id <= 62,
             f"replica_of_broker_id must be between 0 and 62 (got {self.replica_of_broker_id})"),
            (not self.replication_curve_authorized_keys_dir or self.replication_curve_secret_key_file,
             "replication_curve_authorized_keys_dir (the members' public keys) needs "
             "replication_curve_secret_key_file (this engine's own key pair)"),
            (self.master_lease_ms % 1_000 == 0 and self.master_lease_ms >= 2_000,
             f"master_lease_ms must be whole seconds, at least 2000 (got {self.master_lease_ms})"),
            (self.master_fence_margin_ms < self.master_lease_ms // 2,
             f"master_fence_margin_ms ({self.master_fence_margin_ms}) must be under half of master_lease_ms "
             f"({self.master_lease_ms})"),
            (not self.replication_endpoint or self.replication_endpoint.startswith("tcp://"),
             f"replication_endpoint must be tcp://host:port (got {self.replication_endpoint!r})"),
            (not self.replica_of or self.replica_of.startswith("tcp://"),
             f"replica_of must be tcp://host:port, its master's replication_endpoint (got {self.replica_of!r})"),
            (self.replication_chunk_bytes_max >= 64 * KiB,
             f"replication_chunk_bytes_max must be at least 64 KiB (got {self.replication_chunk_bytes_max})"),
            (self.topic_queue_count_default <= self.topic_queue_count_max,
             f"topic_queue_count_default ({self.topic_queue_count_default}) must be between 1 and "
             f"topic_queue_count_max ({self.topic_queue_count_max})"),
            (self.client_frame_bytes_max >= self.send_batch_bytes_max + 64 * KiB,
             f"client_frame_bytes_max ({self.client_frame_bytes_max}) must exceed send_batch_bytes_max "
             f"({self.send_batch_bytes_max}) by 64 KiB"),
            (0 < self.disk_max_used_space_ratio <= self.disk_space_clean_forcibly_ratio
             <= self.disk_space_warning_level_ratio <= 1,
             f"disk ratios must satisfy 0 < disk_max_used_space_ratio ({self.disk_max_used_space_ratio}) <= "
             f"disk_space_clean_forcibly_ratio ({self.disk_space_clean_forcibly_ratio}) <= "
             f"disk_space_warning_level_ratio ({self.disk_space_warning_level_ratio}) <= 1"),
            (self.file_reserved_time_hours >= 0,
             f"file_reserved_time_hours must not be negative (got {self.file_reserved_time_hours})"),
            (self.bind_non_loopback or is_loopback_endpoint(self.endpoint),
             f"endpoint {self.endpoint} is not a loopback address; set bind_non_loopback = true to serve other "
             f"machines (and consider curve_enabled)"),
            (not self.acl_enabled or self.curve_enabled or is_loopback_endpoint(self.endpoint),
             f"acl_enabled with endpoint {self.endpoint} needs curve_enabled: the client endpoint's users are the "
             f"CURVE keys its clients prove, and without them it would serve other machines unchecked"),
            (not self.curve_enabled or (self.curve_server_secret_key_file and self.curve_authorized_keys_dir),
             f"curve_enabled needs curve_server_secret_key_file ({self.curve_server_secret_key_file!r}) and "
             f"curve_authorized_keys_dir ({self.curve_authorized_keys_dir!r})"),
            (_GRPC_ENDPOINT.fullmatch(self.grpc_endpoint) is not None,
             f"grpc_endpoint {self.grpc_endpoint!r} must be host:port"),
            (self.bind_non_loopback or is_loopback_endpoint(f"tcp://{self.grpc_endpoint}"),
             f"grpc_endpoint {self.grpc_endpoint} is not a loopback address; set bind_non_loopback = true to serve "
             f"other machines (and consider grpc_tls_cert_file)"),
            (bool(self.grpc_tls_cert_file) == bool(self.grpc_tls_key_file),
             f"grpc_tls_cert_file ({self.grpc_tls_cert_file!r}) and grpc_tls_key_file ({self.grpc_tls_key_file!r}) "
             f"go together"),
            (not self.grpc_tls_client_ca_file or self.grpc_tls_cert_file,
             "grpc_tls_client_ca_file needs grpc_tls_cert_file and grpc_tls_key_file (client certificates are "
             "checked in a TLS handshake)"),
            (not (self.grpc_enabled and self.curve_enabled) or self.grpc_curve_client_secret_key_file,
             "grpc_enabled with curve_enabled needs grpc_curve_client_secret_key_file (a key the front allows; "
             "got '')"),
            (bool(self.grpc_retry_delays_ms) and min(self.grpc_retry_delays_ms) >= 0,
             f"grpc_retry_delays_ms needs at least one delay, none negative (got {list(self.grpc_retry_delays_ms)})"),
            *_http_endpoint_checks("metrics_endpoint", self.metrics_endpoint, self.bind_non_loopback),
            *_http_endpoint_checks("dashboard_endpoint", self.dashboard_endpoint, self.bind_non_loopback),
            (not self.metrics_endpoint or self.metrics_endpoint != self.dashboard_endpoint,
             f"metrics_endpoint and dashboard_endpoint must differ (the dashboard serves /metrics too; both are "
             f"{self.metrics_endpoint!r})"),
            (self.timer_max_delay_ms < 2**31 - 2 * self.timer_precision_ms,
             f"timer_max_delay_ms must be below 2^31 ms (24.8 days): a timer unit holds the delay in 32 bits "
             f"(got {self.timer_max_delay_ms})"),
            (self.timer_wheel_slots * self.timer_precision_ms >= 2 * self.timer_max_delay_ms,
             f"the timer wheel must span twice timer_max_delay_ms ({self.timer_max_delay_ms}): timer_wheel_slots "
             f"({self.timer_wheel_slots}) x timer_precision_ms ({self.timer_precision_ms})"),
            (self.timer_log_segment_bytes % 52 == 0,
             f"timer_log_segment_bytes must be a multiple of 52 (the unit), at least 64 units "
             f"(got {self.timer_log_segment_bytes})"),
            (bool(self.delay_levels_ms) and min(self.delay_levels_ms) >= 1,
             f"delay_levels_ms needs at least one level, each positive (got {list(self.delay_levels_ms)})"),
            (self.log_format in ("text", "json"), f'log_format must be "text" or "json" (got {self.log_format!r})'),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self

    def _minimum_checks(self) -> list[tuple[bool, str]]:
        """Each numeric setting against its smallest value, the message naming the key and the value."""
        checks = []
        for key, minimum in _MINIMUMS.items():
            value = getattr(self, key)
            if value < minimum:
                need = {0: "must not be negative", 1: "must be positive"}.get(minimum, f"must be at least {minimum}")
                checks.append((False, f"{key} {need} (got {value})"))
        return checks

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
        if values.get("profile") == "dev":
            values = {**DEV_PROFILE, **values}  # the file's own values win over the profile's
        # Message ids carry the port clients reach: the endpoint's, unless store_port is set itself.
        endpoint = values.get("endpoint")
        if "store_port" not in values and isinstance(endpoint, str) and endpoint.startswith("tcp://") \
                and endpoint.rsplit(":", 1)[-1].isdigit():
            values["store_port"] = int(endpoint.rsplit(":", 1)[-1])
        base = Path(path).resolve().parent if path is not None else Path.cwd()
        for key in ("curve_server_secret_key_file", "curve_authorized_keys_dir", "grpc_tls_cert_file",
                    "grpc_tls_key_file", "grpc_curve_client_secret_key_file", "replication_curve_secret_key_file",
                    "grpc_tls_client_ca_file", "etcd_tls_ca_file", "etcd_tls_cert_file", "etcd_tls_key_file",
                    "replication_curve_authorized_keys_dir", "etcd_password_file"):
            value = values.get(key)
            if isinstance(value, str) and value:
                values[key] = str(base / Path(value).expanduser())  # an absolute path stays as it is
        try:
            return msgspec.convert(values, cls).validate()
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid config: {exc}") from exc

    def to_toml_dict(self) -> dict[str, object]:
        return msgspec.structs.asdict(self)


# ``profile = "dev"``: a store for a laptop or a test run (docs/configuration.md 2.9). The file
# formats stay RocketMQ's; the files are smaller (RocketMQ reads them with the same sizes set:
# mappedFileSizeCommitLog, maxHashSlotNum, maxIndexNum).
DEV_PROFILE: dict[str, object] = {
    "segment_size_bytes": 64 * MiB,
    "index_hash_slot_count": 100_000,  # 400 KB of slots
    "index_item_count_max": 400_000,  # 8 MB of items
    "timer_max_delay_ms": 86_400_000,  # 1 day: a wheel of 2 days of 1 s slots (5.3 MiB)
    "timer_wheel_slots": 2 * 86_400,
    "timer_log_segment_bytes": 52 * 65_536,  # 3.25 MiB timer-log files
    "segment_reserve_step_bytes": 1 * MiB,
    "consume_queue_reserve_step_bytes": 16 * KiB,
    "index_reserve_step_bytes": 256 * KiB,
    "timer_reserve_step_bytes": 256 * KiB,
    "auto_create_topics_max": 100,
}


# The smallest value of each numeric setting (0: "must not be negative", 1: "must be positive").
_MINIMUMS: dict[str, int] = {
    "store_port": 1, "election_wait_ms": 0, "etcd_request_timeout_ms": 1,
    "cluster_routes_refresh_ms": 100, "master_fence_margin_ms": 1,
    "broker_id": 0, "replica_of_broker_id": 0, "master_lease_ms": 2_000,
    "segment_size_bytes": 4 * KiB, "consume_queue_file_units": 1, "index_hash_slot_count": 1,
    "index_item_count_max": 2,
    "message_body_bytes_max": 1, "properties_bytes_max": 1, "send_batch_bytes_max": 1,
    "topic_queue_count_default": 1, "topic_queue_count_max": 1, "topic_count_max": 1,
    "pull_message_count_max": 1, "pull_bytes_max": 1, "query_result_count_max": 1, "query_keys_per_request_max": 1,
    "consumer_offset_persist_interval_ms": 1, "consumer_offset_entries_max": 1, "check_memory_bytes_max": 1,
    "consumer_session_timeout_ms": 300, "consumer_group_members_max": 1,
    "long_poll_wait_ms_max": 0, "long_poll_parked_max": 0, "long_poll_wakes_per_turn_max": 1,
    "catch_up_bytes_per_turn_max": 1,
    "pop_journal_entries_max": 1, "pop_journal_idle_fold_ms": 1, "pop_invisible_ms_max": 1,
    "max_delivery_attempts": 1, "dead_letter_retry_ms": 1,
    "grpc_streams_max": 1, "grpc_message_bytes_max": 1, "grpc_request_timeout_ms": 1, "grpc_long_polling_ms": 0,
    "grpc_invisible_ms_default": 1,
    "metrics_report_interval_ms": 1,
    "timer_precision_ms": 1, "timer_max_delay_ms": 1, "timer_wheel_slots": 1, "timer_log_segment_bytes": 52 * 64,
    "timer_deliveries_in_flight_max": 1, "timer_checkpoint_interval_ms": 1,
    "transaction_timeout_ms": 1, "transaction_check_interval_ms": 1, "transaction_check_max": 1,
    "transaction_halves_max": 1,
    "replication_chunk_bytes_max": 1, "replication_chunks_in_flight_max": 1, "replication_report_interval_ms": 1,
    "replication_config_interval_ms": 1,
    "replica_silence_ms_max": 1, "min_in_sync_replicas": 1, "replica_lag_max_ms": 1,
    "replication_heartbeat_timeout_ms": 1,
    "flush_interval_ms": 1, "flush_least_pages": 0, "flush_thorough_interval_ms": 0,
    "flush_consume_queue_interval_ms": 1, "checkpoint_interval_ms": 1, "sync_flush_timeout_ms": 1,
    "writer_sync_in_loop_ms_max": -1,
    "clean_resource_interval_ms": 1, "delete_segment_count_max": 0,  # 0: no segment is deleted
    "send_queue_wait_ms_max": 0, "writer_queue_requests_max": 1,
    "consume_queue_owner_count": 1, "dispatch_batch_records_max": 1, "dispatch_batches_per_turn_max": 1,
    "dispatch_tick_interval_ms": 1, "heartbeat_interval_ms": 1, "heartbeat_timeout_ms": 1,
    "actor_start_timeout_ms": 1, "actor_stop_timeout_ms": 1, "restart_count_max": 0, "restart_window_ms": 0,
    "restart_backoff_ms": 0, "socket_hwm_messages": 0, "client_frame_bytes_max": 1,
    "log_file_bytes_max": 4 * KiB, "log_files_kept": 2, "audit_log_bytes_max": 4 * KiB, "audit_log_files_kept": 1,
    "acl_signature_skew_ms_max": 1_000,
    "http_connections_max": 1, "http_request_timeout_ms": 1, "http_workers_max": 1,
    "segment_reserve_step_bytes": 4 * KiB, "consume_queue_reserve_step_bytes": 4 * KiB,
    "index_reserve_step_bytes": 4 * KiB, "timer_reserve_step_bytes": 4 * KiB, "auto_create_topics_max": 0,
}


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
