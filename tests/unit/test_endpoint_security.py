"""Where the engine may listen, and the CURVE key files it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import ConfigError, StoreConfig
from engine.ipc.curve import CurveKeys, check_authorized_keys_dir, keygen, load_server_keys

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:10911", "tcp://127.9.9.9:1", "tcp://localhost:1",
                                      "tcp://[::1]:1", "ipc:///tmp/engine.sock"])
def test_loopback_endpoints_need_no_setting(endpoint: str) -> None:
    assert StoreConfig.load(None, endpoint=endpoint).endpoint == endpoint


@pytest.mark.parametrize("endpoint", ["tcp://*:10911", "tcp://0.0.0.0:10911", "tcp://10.1.2.3:10911",
                                      "tcp://eth0:10911", "tcp://example.org:10911"])
def test_other_endpoints_need_bind_non_loopback(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="bind_non_loopback"):
        StoreConfig.load(None, endpoint=endpoint)
    assert StoreConfig.load(None, endpoint=endpoint, bind_non_loopback=True).endpoint == endpoint


def test_curve_needs_both_key_settings_and_resolves_them_beside_the_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="curve_enabled needs"):
        StoreConfig.load(None, curve_enabled=True, curve_authorized_keys_dir="/tmp")
    config_file = tmp_path / "etc" / "engine.toml"
    config_file.parent.mkdir()
    config_file.write_text('curve_enabled = true\ncurve_server_secret_key_file = "keys/server.key_secret"\n'
                           'curve_authorized_keys_dir = "/srv/allowed"\n')
    config = StoreConfig.load(config_file)
    assert config.curve_server_secret_key_file == str(tmp_path / "etc" / "keys" / "server.key_secret")
    assert config.curve_authorized_keys_dir == "/srv/allowed"


def test_keygen_writes_a_private_pair_that_loads_and_never_overwrites(tmp_path: Path) -> None:
    public_file, secret_file = keygen(tmp_path, "server")
    assert secret_file.stat().st_mode & 0o777 == 0o600
    public, secret = load_server_keys(secret_file)
    assert len(public) == len(secret) == 40
    keys = CurveKeys.from_files(public_file, secret_file)
    assert keys.server_public_key == keys.public_key == public.decode()
    with pytest.raises(FileExistsError):
        keygen(tmp_path, "server")
    with pytest.raises(ValueError, match="no secret key"):
        load_server_keys(public_file)
    assert check_authorized_keys_dir(tmp_path) == 1
    with pytest.raises(ValueError, match="not a directory"):
        check_authorized_keys_dir(tmp_path / "missing")


def test_a_secret_key_in_the_allowed_folder_is_named_for_the_warning_and_never_allowed(tmp_path: Path) -> None:
    from engine.ipc.curve import secret_keys_in

    allowed = tmp_path / "clients"
    keygen(allowed, "careless")  # both files, where only the public one belongs
    assert secret_keys_in(allowed) == ["careless.key_secret"]
    assert check_authorized_keys_dir(allowed) == 1  # the public .key alone is counted
    assert secret_keys_in(tmp_path / "missing") == []
