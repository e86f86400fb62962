"""Conformance driver of the Python client (``engine/client.py``); the contract is clients/conformance.md.

    python clients/python/conformance.py ENDPOINT [--server-key Z85 --public-key Z85 --secret-key Z85]
                                         [--timeout-ms N] < commands.json > results.json
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import zmq  # noqa: E402

from engine.client import EngineError, RequestTimeout, StoreClient  # noqa: E402
from engine.ipc.curve import CurveKeys  # noqa: E402


def message_json(message: dict[str, Any]) -> dict[str, Any]:
    shown = {name: value for name, value in message.items() if name != "body"}
    shown["body_b64"] = base64.b64encode(message["body"]).decode()
    return shown


def run(client: StoreClient, command: dict[str, Any]) -> dict[str, Any]:
    op = command["op"]
    if op == "send":
        messages = [{"body": base64.b64decode(m["body_b64"]),
                     **{k: m[k] for k in ("tags", "keys", "properties") if k in m}} for m in command["messages"]]
        queue_id = command.get("queue_id")
        delivery = {k: command[k] for k in ("delay_ms", "deliver_at_ms", "delay_level", "producer_group")
                  if command.get(k) is not None}
        if command.get("transaction"):
            delivery["transaction"] = True
        if delivery:
            results = client.send(command["topic"], messages, queue_id=queue_id, **delivery)
        elif len(messages) == 1:
            one = messages[0]
            results = [client.send_one(command["topic"], one["body"], tags=one.get("tags"),
                                       keys=one.get("keys", ()), properties=one.get("properties"),
                                       queue_id=queue_id)]
        else:
            results = client.send(command["topic"], messages, queue_id=queue_id)
        return {"results": results}
    if op == "pull":
        reply = client.pull(command["topic"], command["queue_id"], command["offset"],
                            max_messages=command.get("max_messages") or 32,
                            max_wait_ms=command.get("max_wait_ms") or 0)
        return {"status": reply["status"], "next_offset": reply["next_offset"], "min_offset": reply["min_offset"],
                "max_offset": reply["max_offset"], "messages": [message_json(m) for m in reply["messages"]]}
    if op == "query_by_key":
        found = client.query_by_key(command["topic"], command["key"], max_results=command.get("max_results") or 64)
        return {"messages": [message_json(m) for m in found]}
    if op == "get_by_id":
        return {"message": message_json(client.get_by_id(command["msg_id"]))}
    if op == "commit_offset":
        client.commit_offset(command["group"], command["topic"], command["queue_id"], command["offset"])
        return {}
    if op == "fetch_offset":
        return {"offset": client.fetch_offset(command["group"], command["topic"], command["queue_id"])}
    if op == "ping":
        client.ping()
        return {}
    if op == "pop":
        popped = client.pop(command["group"], command["topic"], queue_id=command.get("queue_id"),
                            max_messages=command.get("max_messages") or 32,
                            invisible_ms=command.get("invisible_ms") or 30_000,
                            max_wait_ms=command.get("max_wait_ms") or 0)
        receipts = [{"receipt_handle": m.pop("receipt_handle"), "attempt": m.pop("attempt")} for m in popped]
        return {"messages": [message_json(m) for m in popped], "receipts": receipts}
    if op == "ack":
        handles = command["receipt_handles"]
        reply = client.request("ack", group=command["group"], topic=command["topic"], queue_id=command["queue_id"],
                               receipt_handles=handles)
        codes = {f["receipt_handle"]: f["error"]["code"] for f in reply["failed"]}
        return {"acked": reply["acked"], "refused": [codes.get(h, 0) for h in handles]}
    if op == "change_invisible":
        message = {"topic": command["topic"], "queue_id": command["queue_id"],
                   "receipt_handle": command["receipt_handle"]}
        return {"receipt_handle": client.change_invisible_duration(command["group"], message,
                                                                   command["invisible_ms"])}
    if op == "pop_stats":
        stats = client.pop_stats(command["group"], command["topic"], command["queue_id"])
        return {k: v for k, v in stats.items() if k not in ("v", "id", "ok")}
    if op == "end_transaction":
        return {"decision": client.end_transaction(command["msg_id"], command["decision"],
                                                   producer_group=command.get("producer_group"))}
    if op == "transaction_checks":
        checks = client.transaction_checks(command["producer_group"], max_messages=command.get("max_messages") or 32,
                                           max_wait_ms=command.get("max_wait_ms") or 0)
        return {"checks": [message_json(m) for m in checks]}
    raise ValueError(f"unknown op {op!r}")


def _join_values(argv: list[str]) -> list[str]:
    """``--public-key VALUE`` -> ``--public-key=VALUE``: a Z85 key may start with '-'."""
    joined: list[str] = []
    options = iter(argv)
    for arg in options:
        if arg in ("--server-key", "--public-key", "--secret-key"):
            arg = f"{arg}={next(options, '')}"
        joined.append(arg)
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance.py")
    parser.add_argument("endpoint")
    parser.add_argument("--server-key")
    parser.add_argument("--public-key")
    parser.add_argument("--secret-key")
    parser.add_argument("--timeout-ms", type=int, default=5000)
    args = parser.parse_args(_join_values(sys.argv[1:] if argv is None else argv))
    keys = (args.server_key, args.public_key, args.secret_key)
    if any(keys) and not all(keys):
        parser.error("--server-key, --public-key and --secret-key go together")
    curve = CurveKeys(*keys) if all(keys) else None
    commands = json.load(sys.stdin)
    results = []
    try:
        client = StoreClient(args.endpoint, timeout_ms=args.timeout_ms, curve=curve)
    except zmq.ZMQError as exc:
        parser.error(f"cannot open the client socket: {exc}")
    with client:
        for command in commands:
            try:
                results.append({"ok": True, **run(client, command)})
            except EngineError as exc:
                results.append({"ok": False, "code": exc.code, "name": exc.name, "message": exc.message})
            except RequestTimeout as exc:
                results.append({"ok": False, "code": -1, "name": "TIMEOUT", "message": str(exc)})
    json.dump(results, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
