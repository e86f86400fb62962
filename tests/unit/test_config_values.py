"""Config values that name things are checked whole, as client names are (no trailing newline or junk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import ConfigError, StoreConfig

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("host", ["127.0.0.1\n", "127.0.0.1 junk", "127.1", "1.2.3.256", "", "localhost",
                                  "::1\n", "[::1]", "2001:db8::1 junk", "2001:db8:::1"])
def test_store_host_must_be_exactly_a_dotted_quad_or_an_ipv6_address(host: str) -> None:
    with pytest.raises(ConfigError, match="store_host"):
        StoreConfig(store_host=host).validate()


@pytest.mark.parametrize("host", ["10.1.2.3", "::1", "2001:db8::7"])
def test_ipv4_and_ipv6_store_hosts_pass(host: str) -> None:
    assert StoreConfig(store_host=host).validate().store_host == host


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:10911\n", "tcp://127.0.0.1:10911 ", "tcp://127.0.0.1",
                                      "udp://127.0.0.1:1", "ipc://", "ipc://a b", "tcp://127.0.0.1:port"])
def test_endpoint_must_be_a_whole_tcp_or_ipc_address(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        StoreConfig(endpoint=endpoint, bind_non_loopback=True).validate()


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:10911", "tcp://localhost:1", "tcp://[::1]:10911",
                                      "ipc:///tmp/engine.sock"])
def test_good_endpoints_pass(endpoint: str) -> None:
    assert StoreConfig(endpoint=endpoint).validate().endpoint == endpoint


@pytest.mark.parametrize(("key", "value"), [
    ("long_poll_wait_ms_max", -1), ("long_poll_parked_max", -1), ("flush_interval_ms", 0),
    ("heartbeat_interval_ms", 0), ("dispatch_tick_interval_ms", -5), ("pull_bytes_max", 0),
    ("pop_invisible_ms_max", 0), ("catch_up_bytes_per_turn_max", 0), ("timer_precision_ms", 0),
    ("transaction_check_max", 0), ("actor_stop_timeout_ms", 0), ("heartbeat_timeout_ms", -1),
    ("restart_backoff_ms", -1), ("store_port", 0), ("store_port", 70_000), ("consume_queue_owner_count", 300),
    ("segment_size_bytes", 5_000), ("properties_bytes_max", 40_000), ("file_reserved_time_hours", -1.0),
    ("sync_flush_timeout_ms", 0), ("query_result_count_max", 0), ("topic_count_max", 0),
])
def test_a_refused_value_is_named_with_its_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as refused:
        StoreConfig(**{key: value}).validate()  # type: ignore[arg-type]
    assert key in str(refused.value) and f"got {value}" in str(refused.value), refused.value


def test_store_port_follows_the_configured_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('endpoint = "tcp://127.0.0.1:10942"\n')
    assert StoreConfig.load(path).store_port == 10942
    assert StoreConfig.load(path, endpoint="tcp://127.0.0.1:10943").store_port == 10943
    path.write_text('endpoint = "tcp://127.0.0.1:10942"\nstore_port = 10911\n')
    assert StoreConfig.load(path).store_port == 10911, "a store_port set itself is kept"
    assert StoreConfig.load(None).store_port == 10911


def test_every_whole_number_setting_has_a_smallest_value() -> None:
    """A new setting is range-checked like the others: its minimum is in the table, or this fails."""
    import msgspec

    from engine.config import _MINIMUMS

    numbers = {f.name for f in msgspec.structs.fields(StoreConfig) if f.type is int}
    assert len(numbers) > 50 and numbers - _MINIMUMS.keys() == set()
    for name in numbers:
        with pytest.raises(ConfigError, match=name):
            StoreConfig().replace(**{name: _MINIMUMS[name] - 1})
