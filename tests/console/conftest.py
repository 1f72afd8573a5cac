"""Fixtures of the console's tests: one headless Chromium per test module (its ``server``
fixture says what the page is served by)."""

from __future__ import annotations

import pytest

from console_browser import chromium


@pytest.fixture(scope="module")
def browser(server):
    """A headless Chromium for the module's tests (skips where none is installed)."""
    with chromium() as b:
        yield b
