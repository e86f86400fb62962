"""The commands that read or write files only: ``inspect`` and ``check`` a store, ``keygen``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.cli.common import EXIT_FAILED, add_command, emit, non_negative, positive
from engine.ipc.curve import CurveKeys, keygen
from engine.progress import StageBars

INSPECT_EXAMPLES = """examples:
  %(prog)s --store-dir /var/lib/rmqpy
  %(prog)s --store-dir /var/lib/rmqpy --records 100 --json > inspect.json
  %(prog)s --store-dir copy-of-broker-store --config engine.toml

Each segment is read up to its last non-zero byte (the zeros after the log's end are not
damage). A path that is not a store exits 5; on a store a running engine holds, a warning says
the figures are a moment's."""

CHECK_EXAMPLES = """examples:
  %(prog)s --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml
  %(prog)s --store-dir /var/lib/rmqpy --json
  %(prog)s --store-dir /var/lib/rmqpy --repair   # the engine must be stopped

Exit status: 0 when nothing is found, 1 with findings (each printed on a line), 5 for a path
that is not a store. On a store a running engine holds, check warns that the figures are a
moment's, and --repair refuses (exit 1)."""

KEYGEN_EXAMPLES = """examples:
  %(prog)s --dir keys --name server                # the engine's key pair
  %(prog)s --dir billing-keys --name billing       # one pair per client, kept by the client

Then copy only the client's public key where the engine reads: cp billing-keys/billing.key
keys/clients/ (the engine allows keys/clients/*.key; a secret key there is warned about)."""


def run_keygen(args: argparse.Namespace) -> int:
    try:
        public_file, secret_file = keygen(args.dir, args.name)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    keys = CurveKeys.from_files(public_file, secret_file)
    facts = {"public_key_file": str(public_file), "secret_key_file": str(secret_file),
             "public_key": keys.public_key, "secret_key": keys.secret_key}
    emit(args, facts, f"public key  {keys.public_key}  ({public_file}: give it to the other side)\n"
                       f"secret key  {keys.secret_key}  ({secret_file}: keep it private)")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from engine.offline.inspect_store import inspect_store, render

    if not args.store_dir:
        print("error: inspect reads a store directory offline; give --store-dir", file=sys.stderr)
        return 2
    _offline_store(args.store_dir)
    with StageBars(enabled=False if args.json else None) as bars:
        report = inspect_store(args.store_dir, segment_size_bytes=args.segment_size_bytes,
                               records_max=args.records, config_path=args.config, progress=bars)
    emit(args, report, render(report))
    return 0


def run_check(args: argparse.Namespace) -> int:
    from engine.offline.check import check_store
    from engine.offline.store_settings import settings_for

    if not args.store_dir:
        print("error: check reads a store directory offline; give --store-dir", file=sys.stderr)
        return 2
    config = settings_for(args.store_dir, args.config)  # --config, else the settings of the store's last start
    if args.repair:
        from engine.offline.repair import StoreBusy, rebuild_derived
        from engine.offline.store_dir import engine_running, require_store

        require_store(args.store_dir)
        if engine_running(args.store_dir):
            print(f"error: an engine is running on {args.store_dir}; stop it before --repair", file=sys.stderr)
            return EXIT_FAILED

        try:
            with StageBars(enabled=False if args.json else None) as bars:
                report = rebuild_derived(args.store_dir, config, progress=bars)
        except StoreBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"rebuilt queues and index from {report.records} records (log end {report.log_end}, "
              f"{report.damaged_ranges} damaged ranges); the old files are in {report.evidence_dir}",
              file=sys.stderr)
    else:
        _offline_store(args.store_dir)
    with StageBars(enabled=None if not args.json else False) as bars:
        findings = check_store(args.store_dir, config, progress=bars)
    emit(args, [f.__dict__ for f in findings],
          "\n".join(str(f) for f in findings) or f"{args.store_dir}: no problems found")
    return 1 if findings else 0


def _offline_store(store_dir: Path) -> None:
    """NotAStore (an OSError: EXIT_OS_ERROR) unless ``store_dir`` is a store; a warning if an engine runs on it."""
    from engine.offline.store_dir import LIVE_WARNING, engine_running, require_store

    require_store(store_dir)
    if engine_running(store_dir):
        print(f"warning: {LIVE_WARNING}", file=sys.stderr)


def add(commands: Any) -> None:
    inspect = add_command(commands, "inspect", "dump a store directory offline: segments, records, queues, index, "
                          "checkpoint", INSPECT_EXAMPLES)
    inspect.add_argument("--store-dir", type=Path, metavar="DIR", help="the store directory to read")
    inspect.add_argument("--config", type=Path, metavar="FILE",
                         help="the TOML the store was written with (default: the settings of its last start, "
                              "config/settings.json)")
    inspect.add_argument("--segment-size-bytes", type=positive, metavar="BYTES",
                         help="override the segment size (default: the size of the files)")
    inspect.add_argument("--records", type=non_negative, default=20, metavar="N",
                         help="how many records to list (default 20)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output (and no progress display)")
    inspect.set_defaults(handler=run_inspect)
    check = add_command(commands, "check", "verify a store offline (CRCs, queues, index, checkpoint)",
                        CHECK_EXAMPLES)
    check.add_argument("--store-dir", type=Path, metavar="DIR", help="the store directory to verify")
    check.add_argument("--config", type=Path, metavar="FILE",
                       help="the TOML the store was written with (default: the settings of its last start, "
                            "config/settings.json)")
    check.add_argument("--json", action="store_true", help="machine-readable output (and no progress bars)")
    check.add_argument("--repair", action="store_true",
                       help="first rebuild queues and index from the log (the store must be stopped)")
    check.set_defaults(handler=run_check)
    keygen = add_command(commands, "keygen", "make a CURVE key pair (NAME.key, NAME.key_secret)",
                         KEYGEN_EXAMPLES)
    keygen.add_argument("--dir", type=Path, required=True, help="where to write the two files")
    keygen.add_argument("--name", required=True, help="file name stem, e.g. server or billing-service")
    keygen.add_argument("--json", action="store_true", help="machine-readable output")
    keygen.set_defaults(handler=run_keygen)
