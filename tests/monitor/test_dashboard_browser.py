"""The dashboard in a real browser: headless Chromium, driven by Selenium, against a live engine.

It checks what a person would see (values in the DOM: actors, queues, a group's lag, a
message found by key) and keeps a screenshot of the page as an artifact of the run, in
``$TEST_ARTIFACTS_DIR`` (default ``build/test-artifacts``).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import require, wait_dispatched
from tests.monitor.conftest import Monitored

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", "build/test-artifacts"))
WAIT_S = 20

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a test dependency (pip install -e '.[test]')")
require(os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK), "Chromium and ChromeDriver")

from selenium.webdriver.common.by import By  # noqa: E402 - after the skip above
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,1700", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_dashboard_shows_the_engine_its_queues_groups_and_messages(monitored: Monitored,
                                                                        browser: webdriver.Chrome) -> None:
    with monitored.engine.client() as client:
        client.create_topic("orders", queue_count=2)
        for i in range(30):
            client.send("orders", [{"body": f"order {i}: 3 apples".encode(), "keys": [f"order-{i}"], "tags": "fruit",
                                    "properties": {"region": "eu"}}])
        client.commit_offset("billing", "orders", 0, 5)
        wait_dispatched(client)  # the queues' units are written after the sends are answered
        ends = {q: client.queue_stats("orders", q)["max_offset"] for q in (0, 1)}
    stop = threading.Event()
    load = threading.Thread(target=_produce_and_pull, args=(monitored, stop))  # for the chart of rates
    load.start()
    try:
        _check_the_page(monitored, browser, ends)
    finally:
        stop.set()
        load.join(30)


def _produce_and_pull(monitored: Monitored, stop: threading.Event) -> None:
    with monitored.engine.client() as client:
        client.create_topic("clicks", queue_count=1)
        offset = 0
        while not stop.is_set():
            client.send("clicks", [{"body": b"click"}] * 50)
            offset = client.pull("clicks", 0, offset, max_messages=50)["next_offset"]
            stop.wait(0.02)


def _check_the_page(monitored: Monitored, browser: webdriver.Chrome, ends: dict[int, int]) -> None:
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.2)
    browser.get(monitored.dashboard_url + "/")

    # the overview: the engine runs, and every actor with it
    wait.until(lambda d: d.find_element(By.ID, "state").text == "RUNNING", "the engine is not shown RUNNING")
    rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#actors tbody tr") or None, "no actors shown")
    shown = {row.get_attribute("data-actor"): row.find_element(By.CSS_SELECTOR, "td.state").text for row in rows}
    assert shown == dict.fromkeys(monitored.engine.actor_pids(), "RUNNING")
    assert browser.find_element(By.ID, "flush-mode").text == "ASYNC_FLUSH"

    # the queues, and the group's lag on queue 0
    def max_offset(d: webdriver.Chrome, queue: int) -> str:
        cells = d.find_elements(By.CSS_SELECTOR, f'#topic-table tr[data-topic="orders"][data-queue="{queue}"] '
                                                 f'td.max-offset')
        return cells[0].text if cells else ""

    wait.until(lambda d: max_offset(d, 0) == str(ends[0]) and max_offset(d, 1) == str(ends[1]),
               f"the queues' max offsets are not shown as {ends}")
    lag = '#group-table tr[data-group="billing"][data-queue="0"] td.lag'
    wait.until(lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, lag)] == [str(ends[0] - 5)],
               "the group's lag is not shown")
    # the chart has drawn its two lines, and the load shows in the rates
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-rates polyline")) == 2
    wait.until(lambda d: re.search(r"now: [1-9][0-9,]* sent/s, [1-9][0-9,]* pulled/s",
                                   d.find_element(By.ID, "rate-now").text), "the rates are not shown")

    # a message found by key, with its properties and body
    browser.find_element(By.ID, "search-topic").send_keys("orders")
    browser.find_element(By.ID, "search-key").send_keys("order-17")
    browser.find_element(By.ID, "search-button").click()
    found = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#results .message") or None, "nothing found")
    assert len(found) == 1
    text = found[0].text
    assert "order 17: 3 apples" in text and "region" in text and "eu" in text and "fruit" in text
    assert found[0].find_element(By.CSS_SELECTOR, ".keys").text == "order-17"

    # a bad id is answered on the page, not by a broken page
    browser.find_element(By.ID, "search-key").clear()
    browser.find_element(By.ID, "search-id").send_keys("not-an-id")
    browser.find_element(By.ID, "search-button").click()
    wait.until(lambda d: "INVALID_MSG_ID" in d.find_element(By.ID, "search-error").text, "no error shown")
    browser.find_element(By.ID, "search-id").clear()
    browser.find_element(By.ID, "search-key").send_keys("order-17")
    browser.find_element(By.ID, "search-button").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#results .message") or None, "nothing found again")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
