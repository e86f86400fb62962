"""Rebuild a store's ConsumeQueues and IndexFiles from its CommitLog with Spark, and verify the store.

``rebuild_store(spark, store_dir, output_dir)`` runs, in parallel:

1. a scan of every segment with every check (``log_heads``): record heads
   and damaged ranges, kept in Spark's memory for the next steps;
2. per queue: its ConsumeQueue files written into ``output_dir`` from the
   records in log order, the queue on disk checked against the log, and its
   files compared byte for byte with the rebuilt ones;
3. per index file: the IndexFiles written into ``output_dir`` (items in log
   order, rolled as the engine rolls them), and every file on disk checked;
4. on the driver: the CommitLog findings and the checkpoint check.

The findings are those ``engine.offline.check.check_store`` reports for the same
store and config (the per-queue and per-item checks are the engine's own
code, run in parallel). The rebuilt files equal the engine's when the
engine dispatched every record once, in order; differences are listed.
``install_rebuilt`` then swaps them in, as ``python -m engine check --repair``
would, keeping the old files as evidence.

The store must not be written meanwhile: a stopped engine's directory, or a
copy. ``output_dir`` must be visible to every executor (a shared file system
on a cluster).
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from engine.config import StoreConfig, encode_config
from engine.names import is_decimal
from engine.offline.check import Finding, check_checkpoint
from engine.offline.inspect_store import detect_config
from engine.offline.repair import StoreBusy, mark_dispatched, move_derived_aside, store_locked
from engine.progress import SparkJobBar
from engine.spark import rebuild_tasks, task_sink
from engine.spark.log_heads import DAMAGE, RECORD, LogHeadsDataSource
from engine.spark.rebuild_tasks import BUILT, DIFFERENCE, FINDING, IndexPlan, JobContext, ResultRow
from engine.store.consume_queue import CONSUME_QUEUE_DIR, ConsumeQueue, list_queues
from engine.store.deleted_topics import DeletedTopics
from engine.store.index_file import INDEX_DIR, index_file_name

_QUEUE_ROW = StructType([
    StructField("topic", StringType(), nullable=False), StructField("queue_id", IntegerType(), nullable=False),
    StructField("queue_offset", LongType(), nullable=False),
    StructField("commit_log_offset", LongType(), nullable=False),
    StructField("size", LongType(), nullable=False), StructField("tags_code", LongType(), nullable=False),
    StructField("on_disk", BooleanType(), nullable=False)])


@dataclass
class RebuildReport:
    findings: list[Finding] = field(default_factory=list)  # what engine.offline.check.check_store reports
    queue_differences: list[str] = field(default_factory=list)  # rebuilt ConsumeQueue files vs the store's
    index_differences: list[str] = field(default_factory=list)  # rebuilt IndexFiles vs the store's
    records: int = 0
    damaged_ranges: int = 0
    queues: int = 0
    index_files: int = 0
    index_items: int = 0
    log_end: int = 0
    output_dir: str = ""

    @property
    def clean(self) -> bool:
        return not (self.findings or self.queue_differences or self.index_differences)


def rebuild_store(spark: SparkSession, store_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str],
                  *, config: StoreConfig | None = None, progress: bool | None = None) -> RebuildReport:
    """Rebuild into ``output_dir`` (which must not exist yet) and verify the store; see the module doc.

    ``progress``: a bar of the jobs' tasks on stderr (None: when stderr is a terminal)."""
    store = Path(store_dir).resolve()
    output = Path(output_dir).resolve()
    if not (store / "commitlog").is_dir():
        raise ValueError(f"{store} is not a store directory: it has no commitlog/")
    if output.exists():
        raise ValueError(f"{output} already exists; the rebuilt files go into a new directory")
    refuse_live_store(store)
    config = detect_config(store, config or StoreConfig())
    output.mkdir(parents=True)
    spark.dataSource.register(LogHeadsDataSource)
    spark.dataSource.register(task_sink.RebuildTaskSink)
    heads = (spark.read.format("rmq_log_heads").option("path", str(store))
             .option("config", encode_config(config).decode()).load())
    heads.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        report = RebuildReport(output_dir=str(output))
        with SparkJobBar(spark.sparkContext, desc="rebuild", enabled=progress):
            _check_log(heads, store, report)
            context = JobContext(str(store), str(output), config, report.log_end)
            _rebuild_queues(spark, heads, store, context, report)
            _rebuild_index(spark, heads, context, report)
        report.findings += check_checkpoint(store, report.log_end)
        return report
    finally:
        heads.unpersist()


def _check_log(heads: DataFrame, store: Path, report: RebuildReport) -> None:
    """engine.offline.check._check_log from the heads: damage before a record is a finding; after the last
    record, only if it holds bytes."""
    records = heads.filter(F.col("kind") == RECORD)
    summary = records.agg(F.count("*").alias("n"), F.max("commit_log_offset").alias("last"),
                          F.max(F.col("commit_log_offset") + F.col("size")).alias("end")).first()
    assert summary is not None  # a global aggregate has one row, even over no rows
    last_offset = summary["last"] if summary["n"] else -1
    first_row = heads.agg(F.min("segment")).first()
    assert first_row is not None
    first_segment = first_row[0]
    report.records = summary["n"]
    report.log_end = summary["end"] if summary["n"] else (first_segment or 0)
    damages = heads.filter(F.col("kind") == DAMAGE).orderBy("commit_log_offset").collect()
    for damage in damages:
        where = f"[{damage['commit_log_offset']}, {damage['commit_log_offset'] + damage['size']})"
        if damage["commit_log_offset"] < last_offset:
            report.findings.append(Finding("commitlog", where, damage["reason"]))
            report.damaged_ranges += 1
        elif damage["holds_bytes"]:
            report.findings.append(Finding("commitlog", where,
                                           f"{damage['reason']} (non-zero bytes after the last record)"))


def _rebuild_queues(spark: SparkSession, heads: DataFrame, store: Path, context: JobContext,
                    report: RebuildReport) -> None:
    deleted = DeletedTopics(store)
    on_disk = []
    for topic, queue_id in list_queues(store):
        cq = ConsumeQueue(store, topic, queue_id, file_units=context.config.consume_queue_file_units, writable=False)
        if not deleted.is_leftover(cq):  # engine.offline.check leaves these out too
            on_disk.append((topic, queue_id, 0, -1, 0, 0, True))
        cq.close()
    rows = (heads.filter((F.col("kind") == RECORD) & ~F.col("hidden"))
            .select("topic", "queue_id", "queue_offset", "commit_log_offset", "size", "tags_code",
                    F.lit(False).alias("on_disk"))
            .unionByName(spark.createDataFrame(on_disk, _QUEUE_ROW)))
    queues = rows.select("topic", "queue_id").distinct().count()
    ordered = (rows.repartition(_tasks(spark, queues), "topic", "queue_id")
               .sortWithinPartitions("topic", "queue_id", "commit_log_offset"))
    results = _run_tasks(ordered, "queues", context)
    report.queues = sum(1 for kind, *_ in results if kind == BUILT)
    findings = sorted((r for r in results if r[0] == FINDING), key=_queue_order)
    report.findings += [Finding(area, where, problem) for _kind, area, where, problem in findings]
    report.queue_differences = sorted(f"{where} {problem}" for kind, _a, where, problem in results
                                      if kind == DIFFERENCE)


def _run_tasks(rows: DataFrame, task: str, context: JobContext, plan: IndexPlan | None = None) -> list[ResultRow]:
    """Run ``task`` over every partition of ``rows`` (task_sink) and return all result rows."""
    results = Path(context.output_dir) / f"_{task}-results.json"
    writer = (rows.write.format(task_sink.SINK_NAME).mode("append").option("task", task)
              .option("context", task_sink.encode_context(context)).option("results", str(results)))
    if plan is not None:
        writer = writer.option("plan", task_sink.encode_plan(plan))
    writer.save()
    found = task_sink.read_results(str(results))
    results.unlink()
    return found


def _tasks(spark: SparkSession, units: int) -> int:
    """How many tasks for ``units`` independent pieces of work: enough to keep every core busy."""
    return max(1, min(units, 4 * spark.sparkContext.defaultParallelism))


def _queue_order(row: ResultRow) -> tuple[str, int, str]:
    topic, _, rest = row[2].partition("/")
    queue_id, _, position = rest.partition("@")
    return topic, int(queue_id), f"{int(position or 0):020d}"


def _rebuild_index(spark: SparkSession, heads: DataFrame, context: JobContext, report: RebuildReport) -> None:
    per_file = context.config.index_item_count_max - 1
    keyed = heads.filter((F.col("kind") == RECORD) & ~F.col("hidden") & (F.size("index_keys") > 0))
    counts = {r["segment"]: r["n"] for r in keyed.groupBy("segment").agg(F.sum(F.size("index_keys")).alias("n"))
              .collect()}
    bases, total = {}, 0
    for segment in sorted(counts):  # items are numbered in log order, segment by segment
        bases[segment] = total
        total += counts[segment]
    report.index_items = total
    built = _write_index_files(spark, keyed, bases, total, per_file, context) if total else []
    report.index_files = len(built)
    directory = Path(context.store_dir) / INDEX_DIR
    on_disk = sorted(n for n in os.listdir(directory) if is_decimal(n)) if directory.is_dir() else []
    report.index_differences = _compare_index_files(spark, context, on_disk, built)
    _check_index_files(spark, context, on_disk, report)


def _write_index_files(spark: SparkSession, keyed: DataFrame, bases: dict[int, int], total: int, per_file: int,
                       context: JobContext) -> list[str]:
    """Write the index files in parallel, one task per file; returns their names, oldest first."""
    base = F.element_at(F.create_map(*[F.lit(x) for kv in bases.items() for x in kv]), F.col("segment"))
    order = Window.partitionBy("segment").orderBy("commit_log_offset", "pos")
    items = (keyed.select("segment", "commit_log_offset", "store_timestamp", "topic",
                          F.posexplode("index_keys").alias("pos", "item_key"))
             .withColumn("ordinal", F.row_number().over(order) - 1 + base)
             .withColumn("file_no", (F.col("ordinal") / per_file).cast("long"))
             .select("file_no", "ordinal", F.concat_ws("#", "topic", "item_key").alias("key"),
                     "commit_log_offset", "store_timestamp"))
    files = -(-total // per_file)
    ends = items.filter(F.col("ordinal") % per_file == per_file - 1).collect()
    started_ms = int(time.time() * 1000)
    plan = IndexPlan(names={n: index_file_name(started_ms + n) for n in range(files)},
                     previous={r["file_no"] + 1: (r["commit_log_offset"], r["store_timestamp"]) for r in ends})
    results = _run_tasks(items.repartition(files, "file_no").sortWithinPartitions("file_no", "ordinal"),
                         "index", context, plan)
    assert sorted(where for _k, _a, where, _p in results) == sorted(plan.names.values()), "an index file is missing"
    return sorted(plan.names.values())


def _compare_index_files(spark: SparkSession, context: JobContext, theirs: list[str], ours: list[str]) -> list[str]:
    """File k of the store against rebuilt file k (names differ: they carry creation times)."""
    differences = []
    if len(theirs) != len(ours):
        differences.append(f"the store has {len(theirs)} index files, the log makes {len(ours)}")
    pairs = list(zip(theirs, ours, strict=False))
    store_index, output_index = Path(context.store_dir) / INDEX_DIR, Path(context.output_dir) / INDEX_DIR
    if pairs:
        compared = spark.sparkContext.parallelize(pairs, _tasks(spark, len(pairs))).map(
            lambda p: (p[0], p[1], rebuild_tasks.first_difference(store_index / p[0], output_index / p[1]))).collect()
        differences += [f"{a} differs from the rebuilt {b} at byte {at}" for a, b, at in compared if at is not None]
    return differences


def _check_index_files(spark: SparkSession, context: JobContext, names: list[str], report: RebuildReport) -> None:
    """engine.offline.check._check_index, one task per group of files."""
    if not names:
        return
    rows = spark.sparkContext.parallelize(names, _tasks(spark, len(names))).flatMap(
        functools.partial(rebuild_tasks.check_index_file, context)).collect()
    report.findings += [Finding(area, where, problem) for _kind, area, where, problem in rows]


def install_rebuilt(store_dir: str | os.PathLike[str], report: RebuildReport) -> Path:
    """Swap the rebuilt files in; the old ``consumequeue/`` and ``index/`` go to ``broken-<time>/``.

    As ``engine.offline.repair``: the store lock is taken first (StoreBusy if an engine runs), and
    the checkpoint's dispatched offset becomes the end of the log. Returns the evidence directory.
    """
    store = Path(store_dir).resolve()
    with store_locked(store):
        evidence = move_derived_aside(store)
        for name in (CONSUME_QUEUE_DIR, INDEX_DIR):
            if (Path(report.output_dir) / name).exists():
                shutil.move(Path(report.output_dir) / name, store / name)
        mark_dispatched(store, report.log_end)
        return evidence


def refuse_live_store(store_dir: str | os.PathLike[str]) -> None:
    """StoreBusy if an engine runs on the store (its lock is held); the job reads a quiet store."""
    store = Path(store_dir).resolve()
    if not (store / "lock").exists():
        return
    fd = os.open(store / "lock", os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusy(f"an engine is running on {store}; stop it (or copy the store) first") from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
