"""Headless Chromium for the console's tests: Debian's ``chromium`` and ``chromium-driver``
driven by selenium (pinned in requirements.lock and the test extra); the tests skip, saying
why, where either is missing (scripts/test.sh installs them when it runs as root).

Screenshots go to ``test-artifacts/console/`` at the top of the repository (ignored by git).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest

ARTIFACTS = os.path.join(os.path.dirname(__file__), "..", "..", "test-artifacts", "console")

#: Chromium as root in a closed network: no sandbox, no GPU, nothing reaching out.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,1000"]


@contextmanager
def chromium() -> Iterator["Browser"]:
    """A fresh headless Chromium (its own profile directory), closed at the end."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("no headless Chromium: install Debian's chromium and chromium-driver "
                    "(scripts/test.sh does when it runs as root)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    profile = tempfile.mkdtemp(prefix="factflow-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ.setdefault("SE_AVOID_STATS", "true")
    session = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield Browser(session)
    finally:
        session.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Browser:
    """A selenium session with the waits and checks the console's tests need."""

    def __init__(self, driver):
        self.driver = driver

    def open(self, url: str) -> None:
        """Load ``url`` (a change of the hash alone only routes, as a user's click would)."""
        self.driver.get(url)

    def wait(self, condition: Callable[[], object], timeout: float = 20, what: str = "") -> object:
        """Poll ``condition`` until it returns something true; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout}s for {what or condition}")
            time.sleep(0.05)

    def css(self, selector: str) -> list:
        """The elements matching ``selector`` now."""
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def text(self, selector: str) -> str:
        """The text of the first element matching ``selector`` ('' if none)."""
        found = self.css(selector)
        return found[0].text if found else ""

    def errors(self) -> list[str]:
        """The browser console's errors since the last call."""
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def screenshot(self, name: str) -> str:
        """Save the page as ``test-artifacts/console/<name>.png``; returns the path."""
        os.makedirs(ARTIFACTS, exist_ok=True)
        path = os.path.abspath(os.path.join(ARTIFACTS, f"{name}.png"))
        self.driver.save_screenshot(path)
        return path


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET (an error status is returned, not raised)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def ask(url: str, op: str, headers: dict[str, str] | None = None, **fields) -> dict:
    """One request on a fresh WebSocket connection (after ``hello`` without a token): the reply."""
    from websockets.sync.client import connect

    with connect(url, additional_headers=headers or {}) as ws:
        ws.send(json.dumps({"op": "hello", "id": 0, "protocol": 1}))
        json.loads(ws.recv(timeout=30))
        ws.send(json.dumps({"op": op, "id": 1, **fields}))
        while True:
            message = json.loads(ws.recv(timeout=120))
            if message.get("id") == 1:
                return message
