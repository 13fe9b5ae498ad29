"""Shared set-up for the tests that look at the course in a real browser (Debian's chromium,
driven by Playwright's Python package; never a downloaded browser)."""

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "build" / "test-artifacts"  # git-ignored: screenshots to look at
REQUIRE_VAR = "PARALLEL_COURSE_REQUIRE_BROWSER"  # set by .ci/run: a missing browser fails
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
]


def chromium_or_skip() -> str:
    path = shutil.which("chromium")
    if path is None:
        reason = (
            "browser tests need Debian's chromium: sudo apt-get install chromium "
            f"(CI installs it and sets {REQUIRE_VAR}=1)"
        )
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def launch(playwright):
    return playwright.chromium.launch(executable_path=chromium_or_skip(), args=CHROMIUM_ARGS)


def is_local(url: str) -> bool:
    return url.startswith(("file:", "data:", "blob:", "about:")) or url.startswith(
        ("http://127.0.0.1", "ws://127.0.0.1", "http://localhost", "ws://localhost")
    )


def offline_page(browser, outside: list[str], width: int, height: int):
    """A page of the given size that lets no request leave the machine (each one tried is
    remembered in ``outside``, to fail the test)."""
    page = browser.new_page(viewport={"width": width, "height": height})

    def guard(route):
        if is_local(route.request.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", guard)
    return page
