"""The alerting rules of deploy/prometheus/ are valid and do what their unit tests say, by promtool.

``promtool check rules`` parses every rule and its PromQL; ``promtool test rules`` feeds each alert
series that should fire it and series that should not (alerts_test.yml), and compares the alerts,
their labels and their rendered annotations. ``promtool check config`` reads the example scrape
config and the rule file it names. promtool comes with Debian's prometheus (make system-tools).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import require

pytestmark = pytest.mark.timeout(60)

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool(*args: str) -> str:
    tool = shutil.which("promtool")
    require(tool is not None, "promtool (Debian's prometheus)")
    assert tool is not None
    done = subprocess.run([tool, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=50, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_every_rule_parses() -> None:
    assert "SUCCESS" in promtool("check", "rules", "alerts.yml")


def test_each_alert_fires_on_its_fault_and_stays_quiet_on_a_healthy_set() -> None:
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml")


def test_the_example_scrape_config_is_valid_with_the_rules() -> None:
    assert "1 rule files found" in promtool("check", "config", "prometheus.yml")
