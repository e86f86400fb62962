"""The batch codec of the hot paths: compiled (``engine._codec``) when built, else Python.

``engine/codec_py.py`` documents every function; the compiled module gives the same
answers byte for byte. Setting ``RMQPY_PURE_PYTHON=1`` in the environment forces the
Python one (tests run both).
"""

from __future__ import annotations

import os

from engine import codec_py

if os.environ.get("RMQPY_PURE_PYTHON"):
    _impl = codec_py
else:
    try:
        from engine import _codec as _impl  # type: ignore[attr-defined, no-redef]
    except ImportError:
        _impl = codec_py

COMPILED: bool = _impl is not codec_py
SCAN_MORE, SCAN_BLANK, SCAN_DAMAGE = codec_py.SCAN_MORE, codec_py.SCAN_BLANK, codec_py.SCAN_DAMAGE

java_hash = _impl.java_hash
owner_index = _impl.owner_index
encode_records = _impl.encode_records
scan_dispatch = _impl.scan_dispatch
read_view = _impl.read_view
index_put_keys = _impl.index_put_keys
index_put_records = _impl.index_put_records
cq_put_packed = _impl.cq_put_packed
unpack_entry = _impl.unpack_entry
pack_entry = codec_py.pack_entry  # the dispatcher's rare Python path (a record stepped over)
index_header = _impl.index_header
index_select = _impl.index_select
pull_run = _impl.pull_run
pull_objects = _impl.pull_objects
build_items = _impl.build_items
batch_items = _impl.batch_items
batch_records = _impl.batch_records
send_results = _impl.send_results
uniq_keys = _impl.uniq_keys


def index_key_hash(key: str) -> int:
    """``layout.index_key_hash`` on ``java_hash``."""
    h = java_hash(key)
    return 0 if h == -0x80000000 else abs(h)


def tags_code(tags: str | None) -> int:
    """``layout.tags_code`` on ``java_hash``."""
    return java_hash(tags) if tags else 0
