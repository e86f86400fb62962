"""``rmq_rebuild_task``: runs the rebuild job's per-partition tasks as Spark write tasks.

    rows.write.format("rmq_rebuild_task").option("task", "queues").option("context", ...)
        .option("results", "/out/_queues.json").mode("append").save()

Each write task hands its partition (Arrow batches, in the partition's
order) to ``rebuild_tasks.queue_task`` or ``index_task`` and returns their
result rows in its commit message; when every task succeeded, ``commit``
writes all result rows to the ``results`` file (atomically), which the job
reads. A task attempt that failed contributes nothing, so a retried task is
counted once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from engine.config import decode_config, encode_config
from engine.spark.options import OptionError, get_str
from engine.spark.rebuild_tasks import IndexPlan, JobContext, ResultRow, index_task, queue_task

SINK_NAME = "rmq_rebuild_task"


def encode_context(context: JobContext) -> str:
    return json.dumps({"store_dir": context.store_dir, "output_dir": context.output_dir,
                       "config": encode_config(context.config).decode(), "log_end": context.log_end})


def decode_context(text: str) -> JobContext:
    raw = json.loads(text)
    return JobContext(raw["store_dir"], raw["output_dir"], decode_config(raw["config"]), raw["log_end"])


def encode_plan(plan: IndexPlan) -> str:
    return json.dumps({"names": plan.names, "previous": plan.previous})


def decode_plan(text: str) -> IndexPlan:
    raw = json.loads(text)
    return IndexPlan({int(k): v for k, v in raw["names"].items()},
                     {int(k): (v[0], v[1]) for k, v in raw["previous"].items()})


def read_results(path: str) -> list[ResultRow]:
    with open(path) as f:
        return [tuple(row) for row in json.load(f)]


@dataclass
class TaskResults(WriterCommitMessage):
    rows: list[ResultRow] = field(default_factory=list)


class RebuildTaskSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def writer(self, schema: StructType, overwrite: bool) -> RebuildTaskWriter:
        task, context, results = (get_str(self.options, n) for n in ("task", "context", "results"))
        if task not in ("queues", "index") or context is None or results is None:
            raise OptionError(f"{SINK_NAME} needs options task (queues or index), context and results")
        return RebuildTaskWriter(task, context, get_str(self.options, "plan"), results)


class RebuildTaskWriter(DataSourceArrowWriter):
    def __init__(self, task: str, context: str, plan: str | None, results: str) -> None:
        self.task = task
        self.context = context
        self.plan = plan
        self.results = results

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskResults:
        context = decode_context(self.context)
        if self.task == "queues":
            return TaskResults(queue_task(context, iterator))
        assert self.plan is not None, "the index task needs its plan"
        return TaskResults(index_task(context, decode_plan(self.plan), iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = [row for m in messages if isinstance(m, TaskResults) for row in m.rows]
        tmp = f"{self.results}.tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, self.results)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo here: the job fails, and its output directory is left for inspection."""
