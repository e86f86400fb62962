"""Fuzz the client endpoint of a live engine with seeded hostile requests (harness/wire_fuzz.py).

    python scripts/fuzz_wire.py --requests 20000
    python scripts/fuzz_wire.py --requests 2000 --seed 7 --json fuzz.json

Starts an engine on a temporary store, stores known messages, sends the requests
(one at a time, then a pipelined flood of topics, groups, queues and parked long
polls), and checks: every request answered with a documented code, or not at all
where docs/protocol.md says so; no actor restarted; each actor's private memory
under its bound; no file made from a fuzzed name anywhere under the store's
parent or the temporary directory; the known messages intact; and, once the
engine is stopped, ``check`` finds nothing. Prints the seed and the figures;
exit code 1 on any violation (rerun with that seed to reproduce it).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import StoreConfig
from engine.offline.check import check_store
from harness import wire_fuzz
from supervisor.launcher import EngineProcess


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2_000, help="how many, a fifth of them as a flood")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed={seed}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="fuzz-wire-"))
    engine = EngineProcess(base / "store", config=StoreConfig.test_min().replace(long_poll_wait_ms_max=2_000))
    started = time.monotonic()
    try:
        engine.start()
        with engine.client() as client:
            known = wire_fuzz.store_known(client)
        flood = args.requests // 5
        report = wire_fuzz.run(engine.endpoint, engine.config, seed=seed, count=args.requests - flood,
                               flood_count=flood)
        problems = report.violations + wire_fuzz.after_checks(engine, known,
                                                              search_dirs=[base, Path(tempfile.gettempdir())])
        engine.stop()
        findings = [str(f) for f in check_store(engine.store_dir, engine.config)]
    finally:
        engine.stop()
        shutil.rmtree(base, ignore_errors=True)
    result = {"seed": seed, "requests": report.requests, "seconds": round(time.monotonic() - started, 1),
              "requests_per_s": round(report.requests / report.seconds), "by_kind": report.by_kind,
              "replies": report.replies, "problems": problems[:50], "problem_count": len(problems),
              "check_findings": findings[:50]}
    ok = not problems and not findings
    result["result"] = "PASS" if ok else "FAIL"
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
