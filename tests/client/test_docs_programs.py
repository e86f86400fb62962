"""The programs of docs/client.md, run as they are written (as separate processes) against a
live engine, in the order the guide shows them: the guide cannot drift from the library."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rmqpy import DEFAULT_ENDPOINT

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "client.md"
README = ROOT / "README.md"


DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
RUN_HERE = {GUIDE: {"producer", "consumer", "pop", "asyncio", "errors", "retry"}, README: {"readme", "raw"}}
"""The programs this module runs, by document (``<!-- run: NAME -->``)."""
RUN_ELSEWHERE = {ROOT / "docs" / "spark.md": ("example", "tests/spark/test_examples.py"),
                 ROOT / "docs" / "cluster.md": ("example", "tests/replication/test_cluster.py")}
"""Documents whose programs another test runs, with their marker (``<!-- example: NAME -->``)."""
_BLOCK = re.compile(r"(?:^<!-- (\w+): ?(.*?) -->\n)?^```python\n", re.MULTILINE)


def test_every_python_block_of_the_docs_is_run_or_says_why_not() -> None:
    """Each ```python block of README.md and docs/*.md is a program a test runs against a live
    engine (``<!-- run: NAME -->`` here, or another test's marker), or says why it is not
    (``<!-- norun: REASON -->``, a sketch or a fragment): an example cannot rot unnoticed."""
    unmarked, unrun = [], []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in _BLOCK.finditer(text):
            where = f"{document.relative_to(ROOT)}:{text.count(chr(10), 0, match.start(0)) + 1}"
            kind, name = match.group(1), (match.group(2) or "").strip()
            if kind == "run" and name in RUN_HERE.get(document, set()):
                continue
            if document in RUN_ELSEWHERE and kind == RUN_ELSEWHERE[document][0] and name:
                continue
            if kind == "norun" and name:
                continue
            (unrun if kind in ("run", "example") else unmarked).append(f"{where} ({kind}: {name})")
    assert not unmarked, ("python blocks with neither <!-- run: NAME --> nor <!-- norun: REASON --> before "
                          f"them: {unmarked}")
    assert not unrun, f"python blocks marked to run that no test runs (RUN_HERE): {unrun}"
    for document, names in RUN_HERE.items():
        assert set(programs(document)) == names, document


def programs(document: Path = GUIDE) -> dict[str, str]:
    """The document's code blocks marked ``<!-- run: NAME -->``, by name."""
    found = re.findall(r"<!-- run: (\w+) -->\n```python\n(.*?)```", document.read_text(), flags=re.DOTALL)
    return dict(found)


def run(program: str, endpoint: str) -> str:
    assert DEFAULT_ENDPOINT in program, "a program of the guide talks to the default endpoint"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", program.replace(DEFAULT_ENDPOINT, endpoint)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{program}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def test_the_guides_programs_run_and_print_what_it_says(endpoint: str) -> None:
    guide = programs()
    assert set(guide) == RUN_HERE[GUIDE]
    assert all(len(code.strip().splitlines()) <= 12 for code in guide.values()), "the guide's programs stay short"

    produced = run(guide["producer"], endpoint).splitlines()
    assert len(produced) == 1 + 4 + 1 and produced[0].startswith("sent ") and "refund stored" in produced[-1]

    consumed = run(guide["consumer"], endpoint).splitlines()
    bodies = sorted(line.split(" ", 2)[2] for line in consumed[:-1])
    assert bodies == sorted([f"order {n} paid" for n in range(1, 6)] + ["order 3 refunded"])
    assert "refunded ('order-3',) order 3 refunded" in consumed
    assert consumed[-1].startswith("billing is at {")

    popped = run(guide["pop"], endpoint).splitlines()
    assert sorted(popped) == sorted([f"done order {n} paid attempt 1" for n in range(1, 6)]
                                    + ["done order 3 refunded attempt 2"])

    assert run(guide["asyncio"], endpoint).strip() == "100 sent, 100 received"
    assert run(guide["errors"], endpoint) == ""
    assert run(guide["retry"], endpoint) == "PUT_OK\n"


def test_the_readmes_programs_run(endpoint: str) -> None:
    readme = programs(README)
    assert set(readme) == RUN_HERE[README] and len(readme["readme"].strip().splitlines()) <= 12
    printed = run(readme["readme"], endpoint).splitlines()
    assert printed[0].startswith("stored at ")
    assert any(line.endswith("('order-1',) order 1 paid") for line in printed[1:]), printed

    for _ in range(3):  # it pulled before the send was dispatched: OFFSET_OVERFLOW_ONE, IndexError 4 runs in 5
        status, body = run(readme["raw"], endpoint).splitlines()[0].split(" ", 1)
        assert (status, body) == ("FOUND", "b'hello'")
