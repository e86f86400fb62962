"""The quick-start examples of docs/spark.md (the README's Spark section), run as they are written.

Only the store path, the endpoint and the output paths are replaced by the test's (the JVM
resolves relative paths against its own working directory), and the stream is drained
(``processAllAvailable``) instead of awaited forever.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.spark.conftest import Store

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def example(name: str) -> str:
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert match, f"docs/spark.md has no example {name!r}"
    return match.group(1)


def test_the_batch_and_streaming_examples_work_as_written(spark, live: Store, tmp_path: Path) -> None:
    batch = example("batch").replace('"store"', repr(str(live.path)))
    assert len(batch.strip().splitlines()) == 5
    namespace: dict[str, object] = {}
    exec(compile(batch, "docs/spark.md: batch", "exec"), namespace)  # the documented example
    assert namespace["orders"].count() == live.sent.count("orders")

    stream = example("stream").replace('"tcp://127.0.0.1:10911"', repr(live.endpoint))
    for name in ("orders-parquet", "orders-checkpoint"):
        stream = stream.replace(f'"{name}"', repr(str(tmp_path / name)))
    stream = stream.replace("query.awaitTermination()", "query.processAllAvailable(); query.stop()")
    exec(compile(stream, "docs/spark.md: stream", "exec"), namespace)
    written = spark.read.parquet(str(tmp_path / "orders-parquet"))
    assert written.count() == live.sent.count("orders")
    assert written.columns == ["queue_id", "queue_offset", "text"]
