"""What checking permissions costs (docs/security.md): the client endpoint with CURVE, its
requests checked against the ACL (``acl_enabled``) or not, in one run.

    python scripts/bench_acl.py                 # 8 rounds of each (about a minute)
    python scripts/bench_acl.py --rounds 4 --sends 1000 --batches 200

One store, its engine started by the script on loopback again for each measurement, with
``acl_enabled`` on or off (the order alternating from round to round: two engines, or one store
measured after the other, differ by more than the check costs); the client's key is a user
allowed ``pub`` on the topic by a policy among a few others (the check walks them as it would in
use). Printed per setting:
single-send latency p50 and p99 (one send in flight, one message of 256 bytes), and produce
throughput (batches of 100 such messages, one in flight), the median and range over the rounds,
and the difference of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.client import StoreClient
from engine.config import StoreConfig
from engine.ipc.curve import CurveKeys, keygen, public_key_of
from engine.security.acl import AclFile, Policy, User, save
from supervisor.launcher import EngineProcess

TOPIC = "acl-bench"
BODY = b"x" * 256
BATCH = 100


def engine(root: Path) -> tuple[EngineProcess, CurveKeys]:
    keys, allowed = root / "keys", root / "allowed"
    allowed.mkdir(parents=True)
    server_public, server_secret = keygen(keys, "server")
    client_public, client_secret = keygen(keys, "client")
    (allowed / "client.key").write_bytes(client_public.read_bytes())
    store = root / "store"
    users = {"bench": User(curve_public_key=public_key_of(client_secret)),
             **{f"other-{k}": User(access_key=f"ak-{k}", secret_key="s") for k in range(8)}}
    policies = [*(Policy(user=f"other-{k}", resource=f"topic:t{k}", actions=["pub"]) for k in range(8)),
                Policy(user="bench", resource="topic:acl-*", actions=["pub", "create"]),
                Policy(user="bench", resource="topic:acl-secret", actions=["*"], decision="deny")]
    save(store, AclFile(users=users, policies=policies))
    made = EngineProcess(store, config=StoreConfig().replace(
        curve_enabled=True, curve_server_secret_key_file=str(server_secret),
        curve_authorized_keys_dir=str(allowed), metrics_endpoint=""))
    return made, CurveKeys.from_files(server_public, client_secret)


def single_sends(client: StoreClient, count: int) -> list[float]:
    took = []
    for _ in range(count):
        began = time.perf_counter()
        client.send(TOPIC, [{"body": BODY}])
        took.append(time.perf_counter() - began)
    return took


def produce(client: StoreClient, batches: int) -> float:
    batch = [{"body": BODY}] * BATCH
    began = time.perf_counter()
    for _ in range(batches):
        client.send(TOPIC, batch)
    return batches * BATCH / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sends", type=int, default=3_000, help="single sends a round")
    parser.add_argument("--batches", type=int, default=1_000, help="batches of 100 a round")
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {name: {"p50": [], "p99": [], "rate": []}
                                                  for name in ("checked", "unchecked")}
    with tempfile.TemporaryDirectory(prefix="bench-acl-") as root:
        made, curve = engine(Path(root))
        base = made.config
        made.start()
        try:
            with StoreClient(made.endpoint, curve=curve) as client:
                client.create_topic(TOPIC, queue_count=4)
        finally:
            made.stop()
        for k in range(args.rounds):
            order = ("checked", "unchecked") if k % 2 == 0 else ("unchecked", "checked")
            for name in order:
                made.config = base.replace(acl_enabled=name == "checked")
                made.start()
                try:
                    with StoreClient(made.endpoint, curve=curve) as client:
                        single_sends(client, 500)  # warm
                        took = sorted(single_sends(client, args.sends))
                        figures[name]["p50"].append(took[len(took) // 2] * 1e3)
                        figures[name]["p99"].append(took[int(len(took) * 0.99)] * 1e3)
                        figures[name]["rate"].append(produce(client, args.batches))
                finally:
                    made.stop()
    print(f"{args.rounds} rounds, each setting once a round: {args.sends} single sends, {args.batches} batches "
          f"of {BATCH} ({len(BODY)} B) each")
    print(f"{'':10} {'send p50 ms':>18} {'send p99 ms':>18} {'produce msg/s':>26}")
    for name, values in figures.items():
        row = [f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for v in (values["p50"], values["p99"])]
        rate = values["rate"]
        print(f"{name:10} {row[0]:>18} {row[1]:>18} "
              f"{statistics.median(rate):>10,.0f} ({min(rate):,.0f}-{max(rate):,.0f})")
    checked, unchecked = figures["checked"], figures["unchecked"]
    p50 = statistics.median(checked["p50"]) / statistics.median(unchecked["p50"]) - 1
    rate = statistics.median(checked["rate"]) / statistics.median(unchecked["rate"]) - 1
    print(f"checked vs unchecked: send p50 {p50:+.1%}, produce {rate:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
