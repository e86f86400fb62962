"""The checkpoint file: RocketMQ's 4 KiB layout plus a CRC'd extension of ours.

The first 40 bytes are RocketMQ's (StoreCheckpoint.java), so RocketMQ tools read
it. Our extension sits at byte 4064, where RocketMQ's reader never looks; it
carries a format version, the commit log offset known to be flushed, the
offset up to which queues and index were flushed, and a CRC over both parts.

The file is replaced whole: written to ``checkpoint.tmp``, fsynced, renamed
over ``checkpoint`` and the directory fsynced, so a crash leaves either the
old or the new version, never a torn one. A file whose CRC does not match
is reported as damaged and recovery falls back to a full scan.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from engine.layout import (
    CHECKPOINT,
    CHECKPOINT_CRC,
    CHECKPOINT_CRC_POSITION,
    CHECKPOINT_EXT,
    CHECKPOINT_EXT_MAGIC,
    CHECKPOINT_EXT_POSITION,
    CHECKPOINT_EXT_VERSION,
    CHECKPOINT_FILE_BYTES,
)
from engine.store.mapped_file import fsync_dir

CHECKPOINT_FILE = "checkpoint"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    # Ours (the extension block):
    flushed_offset: int = 0
    dispatched_offset: int = 0

    def encode(self) -> bytes:
        buf = bytearray(CHECKPOINT_FILE_BYTES)
        CHECKPOINT.pack_into(buf, 0, self.physic_msg_timestamp_ms, self.logics_msg_timestamp_ms,
                             self.index_msg_timestamp_ms, self.master_flushed_offset, self.confirm_phy_offset)
        CHECKPOINT_EXT.pack_into(buf, CHECKPOINT_EXT_POSITION, CHECKPOINT_EXT_MAGIC, CHECKPOINT_EXT_VERSION,
                                 self.flushed_offset, self.dispatched_offset, 0)
        CHECKPOINT_CRC.pack_into(buf, CHECKPOINT_CRC_POSITION, _crc(buf))
        return bytes(buf)

    @property
    def min_timestamp_ms(self) -> int:
        """StoreCheckpoint#getMinTimestamp: min(physic, logics) - 3 s, not below 0."""
        return max(0, min(self.physic_msg_timestamp_ms, self.logics_msg_timestamp_ms) - 3000)


def _crc(buf: bytes | bytearray) -> int:
    return zlib.crc32(bytes(buf[CHECKPOINT_EXT_POSITION:CHECKPOINT_CRC_POSITION]),
                      zlib.crc32(bytes(buf[:CHECKPOINT.size])))


class CheckpointError(ValueError):
    """The checkpoint exists but cannot be trusted."""


def decode_checkpoint(data: bytes) -> Checkpoint:
    if len(data) != CHECKPOINT_FILE_BYTES:
        raise CheckpointError(f"checkpoint is {len(data)} bytes, expected {CHECKPOINT_FILE_BYTES}")
    fields: tuple[int, int, int, int, int] = CHECKPOINT.unpack_from(data, 0)
    magic, version, flushed, dispatched, _reserved = CHECKPOINT_EXT.unpack_from(data, CHECKPOINT_EXT_POSITION)
    if magic != CHECKPOINT_EXT_MAGIC:
        if any(data[CHECKPOINT_EXT_POSITION:]):
            raise CheckpointError("checkpoint extension damaged (bad magic)")
        # A RocketMQ broker's checkpoint: its 40 bytes, none of our extension.
        return Checkpoint(*fields)
    if version != CHECKPOINT_EXT_VERSION:
        raise CheckpointError(f"checkpoint extension version {version} is not supported")
    (stored_crc,) = CHECKPOINT_CRC.unpack_from(data, CHECKPOINT_CRC_POSITION)
    if stored_crc != _crc(data):
        raise CheckpointError("checkpoint CRC mismatch")
    return Checkpoint(*fields, flushed_offset=flushed, dispatched_offset=dispatched)


def load_checkpoint(store_dir: Path) -> Checkpoint | None:
    """The stored checkpoint, None if there is none; CheckpointError if damaged."""
    try:
        data = (store_dir / CHECKPOINT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return decode_checkpoint(data)


def store_checkpoint(store_dir: Path, checkpoint: Checkpoint) -> None:
    path = store_dir / CHECKPOINT_FILE
    tmp = path.with_name(CHECKPOINT_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, checkpoint.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    fsync_dir(store_dir)
