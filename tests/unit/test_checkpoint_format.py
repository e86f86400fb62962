"""Golden-byte tests for the 4 KiB checkpoint file (reference section 6.3).

Bytes 0..40 are RocketMQ's StoreCheckpoint: five big-endian int64 fields.
Bytes 4064..4096 are the engine's CRC'd extension (engine/layout.py drawing),
which RocketMQ's reader never looks at.
"""

from __future__ import annotations

import os
import struct
import zlib

import pytest

from engine.store.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    CheckpointError,
    decode_checkpoint,
    load_checkpoint,
    store_checkpoint,
)

pytestmark = pytest.mark.timeout(30)

PHYSIC_TS = 1_700_000_000_111
LOGICS_TS = 1_700_000_000_222
INDEX_TS = 1_700_000_000_333
MASTER_FLUSHED = 123_456_789
CONFIRM_PHY = 987_654_321
FLUSHED = 555_555
DISPATCHED = 444_444

EXT_AT = 4064
EXT_MAGIC = 0x524D5143  # "RMQC"


def _checkpoint() -> Checkpoint:
    return Checkpoint(physic_msg_timestamp_ms=PHYSIC_TS, logics_msg_timestamp_ms=LOGICS_TS,
                      index_msg_timestamp_ms=INDEX_TS, master_flushed_offset=MASTER_FLUSHED,
                      confirm_phy_offset=CONFIRM_PHY, flushed_offset=FLUSHED, dispatched_offset=DISPATCHED)


def hand_built_checkpoint() -> bytes:
    rocketmq = (struct.pack(">q", PHYSIC_TS)         # 0  physicMsgTimestamp
                + struct.pack(">q", LOGICS_TS)       # 8  logicsMsgTimestamp
                + struct.pack(">q", INDEX_TS)        # 16 indexMsgTimestamp
                + struct.pack(">q", MASTER_FLUSHED)  # 24 masterFlushedOffset
                + struct.pack(">q", CONFIRM_PHY))    # 32 confirmPhyOffset
    ext = (struct.pack(">I", EXT_MAGIC)              # 4064 magic "RMQC"
           + struct.pack(">I", 1)                    # 4068 version
           + struct.pack(">q", FLUSHED)              # 4072 flushed offset
           + struct.pack(">q", DISPATCHED)           # 4080 dispatched offset
           + struct.pack(">i", 0))                   # 4088 reserved
    crc = zlib.crc32(rocketmq + ext)                 # 4092 crc32 over 0..40 and 4064..4092
    out = rocketmq + bytes(EXT_AT - 40) + ext + struct.pack(">I", crc)
    assert len(out) == 4096
    return out


def test_encode_is_4096_bytes_with_rocketmq_fields_first():
    data = _checkpoint().encode()
    assert len(data) == 4096
    assert data[:40] == struct.pack(">qqqqq", PHYSIC_TS, LOGICS_TS, INDEX_TS, MASTER_FLUSHED, CONFIRM_PHY)
    assert data[0:8] == PHYSIC_TS.to_bytes(8, "big")
    assert data[8:16] == LOGICS_TS.to_bytes(8, "big")
    assert data[16:24] == INDEX_TS.to_bytes(8, "big")
    assert data[24:32] == MASTER_FLUSHED.to_bytes(8, "big")
    assert data[32:40] == CONFIRM_PHY.to_bytes(8, "big")
    assert data[40:4064] == bytes(4024)


def test_encode_matches_hand_built_bytes():
    assert _checkpoint().encode() == hand_built_checkpoint()
    assert _checkpoint().encode()[EXT_AT:EXT_AT + 4] == b"RMQC"


def test_decode_round_trips():
    cp = _checkpoint()
    assert decode_checkpoint(cp.encode()) == cp
    assert decode_checkpoint(hand_built_checkpoint()) == cp
    assert decode_checkpoint(Checkpoint().encode()) == Checkpoint()


@pytest.mark.parametrize("position", list(range(40)))
def test_flipped_byte_in_rocketmq_fields_is_detected(position):
    data = bytearray(_checkpoint().encode())
    data[position] ^= 0x01
    with pytest.raises(CheckpointError):
        decode_checkpoint(bytes(data))


@pytest.mark.parametrize("position", list(range(EXT_AT, 4096)))
def test_flipped_byte_in_extension_is_detected(position):
    data = bytearray(_checkpoint().encode())
    data[position] ^= 0x01
    with pytest.raises(CheckpointError):
        decode_checkpoint(bytes(data))


def test_wrong_length_is_rejected():
    data = _checkpoint().encode()
    with pytest.raises(CheckpointError):
        decode_checkpoint(data[:4095])
    with pytest.raises(CheckpointError):
        decode_checkpoint(data + b"\x00")
    with pytest.raises(CheckpointError):
        decode_checkpoint(b"")


def test_rocketmq_only_checkpoint_decodes_without_extension():
    data = struct.pack(">qqqqq", PHYSIC_TS, LOGICS_TS, INDEX_TS, MASTER_FLUSHED, CONFIRM_PHY) + bytes(4096 - 40)
    cp = decode_checkpoint(data)
    assert (cp.physic_msg_timestamp_ms, cp.logics_msg_timestamp_ms, cp.index_msg_timestamp_ms,
            cp.master_flushed_offset, cp.confirm_phy_offset) == (PHYSIC_TS, LOGICS_TS, INDEX_TS,
                                                                 MASTER_FLUSHED, CONFIRM_PHY)
    assert cp.flushed_offset == 0
    assert cp.dispatched_offset == 0


def test_min_timestamp():
    assert Checkpoint(physic_msg_timestamp_ms=10_000, logics_msg_timestamp_ms=5_000).min_timestamp_ms == 2_000
    assert Checkpoint(physic_msg_timestamp_ms=5_000, logics_msg_timestamp_ms=10_000).min_timestamp_ms == 2_000
    assert _checkpoint().min_timestamp_ms == PHYSIC_TS - 3_000
    # clamped at 0
    assert Checkpoint(physic_msg_timestamp_ms=1_000, logics_msg_timestamp_ms=50_000).min_timestamp_ms == 0
    assert Checkpoint(physic_msg_timestamp_ms=3_000, logics_msg_timestamp_ms=3_000).min_timestamp_ms == 0
    assert Checkpoint().min_timestamp_ms == 0
    # the index timestamp plays no part
    assert Checkpoint(physic_msg_timestamp_ms=10_000, logics_msg_timestamp_ms=10_000,
                      index_msg_timestamp_ms=1).min_timestamp_ms == 7_000


def test_store_and_load_round_trip(tmp_path):
    assert load_checkpoint(tmp_path) is None
    cp = _checkpoint()
    store_checkpoint(tmp_path, cp)
    path = tmp_path / CHECKPOINT_FILE
    assert path.stat().st_size == 4096
    assert path.read_bytes() == hand_built_checkpoint()
    assert load_checkpoint(tmp_path) == cp
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_FILE]  # no .tmp left behind

    newer = Checkpoint(physic_msg_timestamp_ms=PHYSIC_TS + 1, flushed_offset=FLUSHED + 100)
    store_checkpoint(tmp_path, newer)
    assert load_checkpoint(tmp_path) == newer
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_FILE]


def test_load_damaged_file_raises(tmp_path):
    store_checkpoint(tmp_path, _checkpoint())
    path = tmp_path / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[8] ^= 0x80
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)
