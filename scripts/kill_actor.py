"""Kill (SIGKILL) or pause (SIGSTOP) one actor of a running engine.

    python scripts/kill_actor.py --store-dir store --role writer
    python scripts/kill_actor.py --store-dir store --role owner          # one of the owners
    python scripts/kill_actor.py --store-dir store --role random --seed 3
    python scripts/kill_actor.py --store-dir store --role reput --pause 5 # SIGSTOP, SIGCONT after 5 s

Roles: writer, flusher, owner, owner-N, index, reput, front, supervisor, random.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.faults import kill_actor, pause_actor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store-dir", type=Path, default=Path("store"))
    parser.add_argument("--role", default="random")
    parser.add_argument("--seed", type=int, help="seed for --role random / owner")
    parser.add_argument("--pause", type=float, metavar="SECONDS", help="SIGSTOP instead, resumed after SECONDS")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.pause is not None:
        name, process = pause_actor(args.store_dir, args.role, rng=rng)
        print(f"paused {name} (pid {process.pid}) for {args.pause} s", flush=True)
        time.sleep(args.pause)  # the pause itself is the fault being injected
        process.resume()
        print(f"resumed {name}")
        return 0
    name, pid = kill_actor(args.store_dir, args.role, rng=rng)
    print(f"killed {name} (pid {pid})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
