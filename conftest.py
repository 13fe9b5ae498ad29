"""Suite-wide pytest hooks.

- Every process the suite starts inherits ``PARALLEL_COURSE_TEST_RUN``; the aftermath tests
  (run last) look for survivors by that mark, orphans included.
- The git status at the start is kept, so the aftermath tests can tell whether the suite left
  files behind.
- At the end, the time each notebook took is printed.
"""

import os
import subprocess
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
RUN_MARK = "PARALLEL_COURSE_TEST_RUN"
AFTERMATH = "tests/test_zz_aftermath.py"

_notebook_seconds: dict[str, float] = defaultdict(float)


def git_status() -> str | None:
    """``git status --porcelain`` of the checkout, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=ROOT, capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def pytest_configure(config):
    os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
    config.stash_git_status = git_status()
    config.stash_start = time.time()


def pytest_collection_modifyitems(session, config, items):
    # The aftermath checks judge the whole run, so they go last.
    items.sort(key=lambda item: item.nodeid.startswith(AFTERMATH))


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _notebook_seconds[path] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _notebook_seconds:
        return
    tr = terminalreporter
    tr.section("time per notebook")
    for path, seconds in sorted(_notebook_seconds.items()):
        tr.write_line(f"{seconds:7.1f} s  {path}")
    tr.write_line(f"{sum(_notebook_seconds.values()):7.1f} s  all notebooks")
