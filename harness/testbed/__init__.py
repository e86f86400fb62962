"""A test bed of hosts in network namespaces (``bed.py``), with partitions and random loss by
nftables and latency by a delaying relay of its own (``relay.py``)."""

from harness.testbed.bed import TestBed

__all__ = ["TestBed"]
