"""Config values that name things are checked whole, as client names are (no trailing newline or junk)."""

from __future__ import annotations

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
