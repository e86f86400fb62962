"""Load, faults and fuzzing for tests and scripts: never imported by the engine, never installed with it.

Workloads (``workload``, ``pop_workload``, ``timer_workload``, ``grpc_workload``) send and read
back through a running engine and verify what came back; ``faults`` kills, pauses and corrupts;
``chaos`` combines them into a seeded kill-and-verify run; ``wire_fuzz`` sends malformed frames.
The package sits above ``engine`` and ``supervisor`` (it starts engines with
``supervisor.launcher``); nothing below imports it, which ``make lint`` checks (import-linter,
the contracts in pyproject.toml). Tests import it from the repository root, and ``scripts/``
put the root on ``sys.path``.
"""
