"""Starting and stopping the SparkSession that jobs, benchmarks and tests use.

The settings are the ones that work here (docs/spark.md): the Python workers
run this interpreter (they must import ``engine``), Python filter pushdown
is on, timestamps are shown in UTC, and the sources are registered.
``stop_session`` also ends the JVM that PySpark started (``SparkSession.stop``
alone leaves it running until the Python process exits).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from engine.spark import register

JVM_EXIT_TIMEOUT_S = 30.0


def build_session(*, master: str = "local[*]", app_name: str = "rmq", driver_memory: str = "1g",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession with the connector registered; ``conf`` adds or overrides settings."""
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.memory", driver_memory)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop ``spark`` and wait for its JVM to exit."""
    context = spark.sparkContext
    gateway = context._gateway  # the only handle on the JVM PySpark launched
    process = getattr(gateway, "proc", None)
    spark.stop()
    if gateway is not None:
        gateway.shutdown()
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()  # the launcher's JVM exits when its stdin closes
        process.wait(JVM_EXIT_TIMEOUT_S)
    type(context)._gateway = None  # so that a new session starts a new JVM
    type(context)._jvm = None
