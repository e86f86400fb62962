"""The audit log: every refusal and every administrative act, one JSON object a line.

    <store>/logs/audit-<process>.jsonl   (rotated at audit_log_bytes_max: .1, .2, ... kept
                                          up to audit_log_files_kept)
    {"time": "2026-12-02T16:25:03.120Z", "event": "refused", "code": "FORBIDDEN",
     "subject": "orders-service", "source": "10.1.2.3", "op": "SendMessage",
     "resource": "topic:orders-secret", "action": "pub", "message": "..."}

One file per process (the front, the gRPC endpoint, the command line's admin acts): no two
processes ever rotate the same file. Writes go straight to the file (line-buffered by the
handler); an audit log that cannot be written is reported on the process's own log and does not
stop the request's refusal.
"""

from __future__ import annotations

import logging
import logging.handlers
import time
from pathlib import Path
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()


class AuditLog:
    def __init__(self, path: Path, *, bytes_max: int, files_kept: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.logger = logging.getLogger(f"audit.{path.name}")
        self.logger.propagate = False  # its lines are the audit file's, not the process log's
        self.logger.setLevel(logging.INFO)
        if not self.logger.handlers:
            handler = logging.handlers.RotatingFileHandler(path, maxBytes=bytes_max, backupCount=files_kept)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)

    def record(self, event: str, **fields: Any) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
        self.logger.info(_encoder.encode({"time": stamp, "event": event, **fields}).decode())

    def close(self) -> None:
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)
