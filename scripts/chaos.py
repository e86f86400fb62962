"""A seeded chaos run: kill random actors (and the supervisor) under load, then verify everything.

    python scripts/chaos.py                      # a fresh random seed, printed first
    python scripts/chaos.py --seed 42 --cycles 40
    python scripts/chaos.py --seed 42 --store-dir /tmp/chaos-store --keep
    python scripts/chaos.py --elected --cycles 8   # a broker set elected on etcd (harness/election_chaos.py)

Exit code 0 when every acknowledged message was read back exactly once, in
its queue and order, with an intact body, and ``check`` found nothing.
Rerun with the printed seed to replay the same fault schedule.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.chaos import ChaosReport, run_chaos
from harness.election_chaos import ElectionChaosReport, run_election_chaos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: a new random seed)")
    parser.add_argument("--cycles", type=int, default=20, help="kill cycles, half per flush mode")
    parser.add_argument("--store-dir", type=Path, help="where to put the store (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the store directory afterwards")
    parser.add_argument("--elected", action="store_true",
                        help="a broker set elected on etcd instead: kill actors, masters, replicas, etcd members; "
                             "pause masters")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed={seed}", flush=True)
    # An elected set's engines keep their stores in a directory of their own; the engine's goes in store/.
    scratch = args.store_dir or Path(tempfile.mkdtemp(prefix="chaos-elected-" if args.elected else "chaos-"))
    report: ChaosReport | ElectionChaosReport
    try:
        if args.elected:
            report = run_election_chaos(scratch, seed=seed, cycles=args.cycles)
        else:
            report = run_chaos(scratch if args.store_dir else scratch / "store", seed=seed, cycles=args.cycles,
                               log=True)
    finally:
        if not args.keep and args.store_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print("schedule: " + " ".join(report.schedule))
    print(report.summary())
    for finding in report.findings:
        print(f"check: {finding}")
    print("PASS" if report.ok else f"FAIL (replay with{' --elected' if args.elected else ''} --seed {seed})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
