"""The nemesis on the test bed of hosts: seeds of faults against a broker set, each checked.

    sudo python scripts/nemesis.py                          # seeds 0-9, two faults each, SYNC
    sudo python scripts/nemesis.py --seeds 100 --faults 1
    sudo python scripts/nemesis.py --kinds master-etcd --planted lease --seeds 3   # must be caught
    sudo python scripts/nemesis.py --seed 17 --keep /tmp/seed17                    # one seed, kept
    python scripts/nemesis.py --summarize /tmp/seed17        # the figures of a run kept (or the slow test's)

Three engines and three etcd members, each on a host of its own (a network namespace), and a
client host with two producers and a reader (harness/testbed/run.py; the faults are listed in
harness/testbed/nemesis.py). Needs root, iproute2 and nftables (``make system-tools``). All
traffic stays inside the namespaces the run makes; each seed's loops are bounded in time.

Printed per seed: its schedule, the checker's verdict and counts, the longest time without an
acknowledgement for each fault; at the end, per kind of fault, the median and the worst of those
times. The exit code is 1 if any seed broke a promise (or, with ``--planted``, if none did).
Each seed's history is kept as JSON lines under ``--keep`` (a temporary folder otherwise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.testbed.checker import unavailable
from harness.testbed.history import load
from harness.testbed.nemesis import FAULTS
from harness.testbed.run import PLANTS, Campaign


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds, from --first (default 10)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seed", type=int, help="one seed only")
    parser.add_argument("--faults", type=int, default=2, help="faults per seed (default 2)")
    parser.add_argument("--mode", choices=("SYNC", "ASYNC"), default="SYNC")
    parser.add_argument("--kinds", default=",".join(FAULTS),
                        help=f"the faults drawn from, separated by commas (default all: {', '.join(FAULTS)})")
    parser.add_argument("--planted", choices=sorted(PLANTS), default="", help="run with a planted bug")
    parser.add_argument("--keep", type=Path, help="the folder the stores, logs and histories stay in")
    parser.add_argument("--summarize", type=Path, metavar="DIR",
                        help="run nothing: print the verdicts and the figures of the histories kept in DIR")
    args = parser.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    if os.geteuid() != 0:
        parser.error("the test bed makes network namespaces: run it as root")
    kinds = tuple(args.kinds.split(","))
    unknown = [kind for kind in kinds if kind not in FAULTS]
    if unknown:
        parser.error(f"no such fault: {', '.join(unknown)}")
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
    root = args.keep or Path(tempfile.mkdtemp(prefix="nemesis-"))
    costs: dict[str, list[float]] = defaultdict(list)
    broken = 0
    began = time.monotonic()
    with Campaign(root, mode=args.mode, kinds=kinds, planted=args.planted) as campaign:
        for seed in seeds:
            report = campaign.run(seed, faults=args.faults)
            broken += not report.ok
            print(("ok     " if report.ok else "BROKEN ") + report.summary(), flush=True)
            for fault, seconds in report.verdict.unavailable_s if report.verdict else []:
                costs[fault.split()[0]].append(seconds)
                print(f"         {fault}: {seconds:.2f} s without an acknowledgement")
    print(f"\n{len(seeds)} seeds in {time.monotonic() - began:.0f} s, {broken} broke a promise; histories in {root}")
    print_costs(costs)
    return int(not broken) if args.planted else int(bool(broken))


def print_costs(costs: dict[str, list[float]]) -> None:
    print("seconds without an acknowledgement, per fault: median, worst (count)")
    for kind in sorted(costs):
        print(f"  {kind:20} {statistics.median(costs[kind]):6.2f} {max(costs[kind]):6.2f}  ({len(costs[kind])})")


def summarize(root: Path) -> int:
    """The verdicts kept in ``root`` and the time without an acknowledgement per fault, from its
    histories; 1 if a seed broke a promise (or none is there)."""
    verdicts = (root / "verdicts.txt").read_text().splitlines() if (root / "verdicts.txt").exists() else []
    costs: dict[str, list[float]] = defaultdict(list)
    for path in sorted(root.glob("history-*.jsonl")):
        for fault, seconds in unavailable(load(path)):
            costs[fault.split()[0]].append(seconds)
    broken = [line for line in verdicts if not line.startswith("ok")]
    print("\n".join(broken) or f"{len(verdicts)} seeds, none broke a promise")
    print_costs(costs)
    return int(bool(broken) or not verdicts)


if __name__ == "__main__":
    sys.exit(main())
