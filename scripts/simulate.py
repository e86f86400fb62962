"""Run the seeded simulation over many seeds and print every seed that breaks an invariant.

    python scripts/simulate.py --seeds 1000            # seeds 0..999
    python scripts/simulate.py --seed 614 --trace      # replay one seed, with its plan and trace
    python scripts/simulate.py --seed 139 --fixed-rates   # under the fixed plan of earlier runs
    python scripts/simulate.py --seeds 200 --steps 1500 --supervisor-deaths 0.004 --fixed-rates  # supervisor deaths
    python scripts/simulate.py --broker-set SYNC --seeds 1000   # three engines elected on a model of etcd
    python scripts/simulate.py --consumer-group --seeds 3000    # members sharing queues, a front that restarts
    python scripts/simulate.py --consumer-group --broker-sets 2  # ... over two broker sets, one failing over

Each seed runs every actor's logic in this process over a simulated network and
disk (``harness/simulation``): kills, power cuts, torn pages, lost publications
and every delivery order come from the seed, so a failing seed replays exactly. So do
the rates of each fault and the mix of work (``Plan.drawn``): ``--trace`` prints them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.group_simulation import GroupRun, simulate_group
from harness.simulation import Outcome, Plan, simulate
from harness.simulation.broker_set import SetOutcome, SetPlan, simulate_set


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run, from --start")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run this one seed only")
    parser.add_argument("--steps", type=int, default=Plan.steps, help="steps per seed")
    parser.add_argument("--supervisor-deaths", type=float, default=0.0, metavar="RATIO",
                        help="how often (per step) the supervisor dies and every actor stops on its own")
    parser.add_argument("--trace", action="store_true",
                        help="print each failing seed's plan and trace of faults (with --seed: even if it passes)")
    parser.add_argument("--replica", choices=("ASYNC", "SYNC"),
                        help="a replica follows the engine, replicating so (docs/replication.md)")
    parser.add_argument("--fixed-rates", action="store_true",
                        help="run the fixed plan every seed ran before plans were drawn from the seed")
    parser.add_argument("--broker-set", choices=("ASYNC", "SYNC"),
                        help="replicating so, a broker set of three engines electing their master on a model of "
                             "etcd, with kills of actors and engines, pauses and partitions "
                             "(harness/simulation/broker_set.py)")
    parser.add_argument("--consumer-group", action="store_true",
                        help="a consumer group's members sharing a topic's queues through the front's membership, "
                             "coming, going, dying and stalling, with lost heartbeats and front restarts "
                             "(harness/group_simulation.py)")
    parser.add_argument("--broker-sets", type=int, choices=(1, 2), default=1,
                        help="with --consumer-group: the topic over this many broker sets, one failing over at "
                             "times (default 1)")
    args = parser.parse_args()
    if args.consumer_group:
        return run_seeds(args, lambda seed: (simulate_group(seed, sets=args.broker_sets), "", ""),
                         "consumer-group seeds")
    if args.broker_set:
        def one_set(seed: int) -> tuple[SetOutcome, str, str]:
            plan = SetPlan.drawn(seed, replication_mode=args.broker_set)
            return simulate_set(seed, plan), "", str(plan)

        return run_seeds(args, one_set, "broker-set seeds")

    def one(seed: int) -> tuple[Outcome, str, str]:
        deaths: dict[str, object] = {"supervisor_death_ratio": args.supervisor_deaths} if args.supervisor_deaths else {}
        if args.replica:
            deaths.update(replica=True, replication_mode=args.replica)
        plan = Plan(steps=args.steps, **deaths) if args.fixed_rates else Plan.drawn(seed, steps=args.steps, **deaths)
        outcome = simulate(seed, plan)
        return outcome, f" ({outcome.flush_mode})", plan.describe()

    return run_seeds(args, one, "seeds")


def run_seeds(args: argparse.Namespace, run_one: Callable[[int], tuple[Outcome | SetOutcome | GroupRun, str, str]],
              what: str) -> int:
    """Run each seed (``run_one``: its outcome, a label, its plan described); print the failing ones
    (with ``--trace``, their plan and trace) and the totals of every figure."""
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    started = time.monotonic()
    failed = 0
    totals: dict[str, int] = {}
    for seed in seeds:
        outcome, label, plan = run_one(seed)
        for name, value in outcome.figures.items():
            totals[name] = totals.get(name, 0) + value
        if outcome.ok and not (args.trace and args.seed is not None):
            continue
        failed += not outcome.ok
        print(f"seed {seed}{label} {'passed' if outcome.ok else 'FAILED'}:")
        for violation in outcome.violations[:10]:
            print(f"    {violation}")
        if args.trace:
            print(f"  plan: {plan}")
            print("  trace:\n" + "\n".join(f"    {line}" for line in outcome.trace))
    elapsed = time.monotonic() - started
    print(f"{len(seeds)} {what}, {failed} failed, {elapsed:.1f} s; "
          + ", ".join(f"{name} {value}" for name, value in totals.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
