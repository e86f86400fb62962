"""The engine's log lines: where they go, how they look, and the events among them.

Every process of the engine (each actor, and the supervisor) writes its log lines to
``STORE/logs/<name>.log``, rotated at ``log_file_bytes_max``, keeping ``log_files_kept`` files
(``<name>.log``, ``<name>.log.1``, ...). Its raw stderr (tracebacks, faulthandler dumps, whatever a
library prints) goes to ``<name>.stderr``, which the supervisor opens for it. With
``log_format = "json"`` each line is one JSON object. docs/operations.md lists the events.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Protocol

LOG_DIR = "logs"
# The keys of a JSON log line; an event's own fields (``event()``) may not take these names.
LOG_LINE_KEYS = frozenset({"ts", "level", "actor", "pid", "logger", "message", "event", "exception", "stack"})


def event(kind: str, **fields: object) -> dict[str, object]:
    """The ``extra=`` of a log line that records an engine event (``actor.restarted``,
    ``flush.failed``, ...): a JSON line carries ``event`` and these fields beside the message.

    The kinds and their wording are stable: monitoring matches on them (docs/operations.md)."""
    assert not LOG_LINE_KEYS & fields.keys(), fields
    return {"event": kind, "event_fields": fields}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ms), level, actor, pid, logger, message, and an
    event's kind and fields, and the exception's traceback, when the line has them."""

    def __init__(self, actor: str) -> None:
        super().__init__()
        self.actor = actor
        # An actor runs as ``python -m engine.actors.<module>``: its own logger is "__main__".
        main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        self.main_module = main_spec.name if main_spec is not None else "__main__"

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, object] = {"ts": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                   "level": record.levelname, "actor": self.actor, "pid": record.process,
                                   "logger": self.main_module if record.name == "__main__" else record.name,
                                   "message": record.getMessage()}
        kind = getattr(record, "event", None)
        if kind is not None:
            line["event"] = kind
            line.update(getattr(record, "event_fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class LogSettings(Protocol):
    """What logging reads of the settings (``StoreConfig`` has them): the store below never imports them."""

    @property
    def log_format(self) -> str: ...
    @property
    def log_file_bytes_max(self) -> int: ...
    @property
    def log_files_kept(self) -> int: ...


def configure_logging(actor: str, log_dir: Path, config: LogSettings, *, stderr: bool = False) -> None:
    """Send this process's log lines to ``log_dir/<actor>.log`` (rotated), and to stderr too if asked.

    Replaces any earlier configuration of the root logger. Uncaught exceptions, in the main
    thread or another, are logged before Python's own report reaches stderr."""
    if config.log_format == "json":
        formatter: logging.Formatter = JsonLogFormatter(actor)
    else:
        formatter = logging.Formatter(f"%(asctime)s {actor}[%(process)d] %(levelname)s %(message)s")
    log_dir.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.handlers.RotatingFileHandler(
        log_dir / f"{actor}.log", maxBytes=config.log_file_bytes_max, backupCount=config.log_files_kept - 1,
        encoding="utf-8")]
    if stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    _log_uncaught_exceptions()


def _log_uncaught_exceptions() -> None:
    report_main, report_thread = sys.__excepthook__, threading.__excepthook__
    crashes = logging.getLogger("crash")

    def main_thread(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            crashes.critical("uncaught %s; the process exits", kind.__name__, exc_info=(kind, value, tb),
                             extra=event("process.crashed"))
        report_main(kind, value, tb)

    def other_thread(args: threading.ExceptHookArgs) -> None:
        thread = args.thread.name if args.thread is not None else "?"
        if not issubclass(args.exc_type, SystemExit):  # which ends a thread quietly
            crashes.critical("uncaught %s in thread %s", args.exc_type.__name__, thread,
                             exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
                             extra=event("thread.crashed", thread=thread))
        report_thread(args)

    sys.excepthook = main_thread
    threading.excepthook = other_thread
