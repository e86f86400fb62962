"""The test bed needs root (namespaces, nftables) and iproute2, nftables: skipped without them
(failed under RMQ_TESTS_REQUIRE_ALL=1, as in CI, which runs as root). After each test no
namespace of this process is left."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from harness.testbed import netns
from tests.helpers import require


@pytest.fixture(autouse=True)
def bed_tools() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the test bed makes network namespaces: it needs root")
    require(shutil.which("ip") is not None and shutil.which("nft") is not None, "iproute2 and nftables")
    yield
    ours = [name for name in netns.namespaces() if name.startswith(netns.owned_name(""))]
    for name in ours:
        netns.delete(name)
    assert not ours, f"namespaces left behind: {ours}"
