"""Run last (see conftest.py): the suite must leave no files and no processes behind."""

import os
import time

import psutil
import pytest

from conftest import RUN_MARK, git_status, marked_processes


def survivors() -> list[psutil.Process]:
    """Processes other than this one that carry this test run's mark, orphans included."""
    return marked_processes(os.environ[RUN_MARK])


def test_no_process_outlives_the_suite():
    deadline = time.monotonic() + 15  # kernels and workers get a moment to shut down
    left = survivors()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = survivors()
    described = [f"pid {p.pid}: {' '.join(p.cmdline())[:120]}" for p in left if p.is_running()]
    for p in left:  # never leave them running, even when failing
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not described, "processes started by the suite are still alive:\n" + "\n".join(described)


def test_working_tree_unchanged(pytestconfig):
    before = pytestconfig.stash_git_status
    if before is None:
        pytest.skip("not a git checkout: cannot compare the working tree")
    after = git_status()
    assert after == before, (
        "the suite changed the working tree (write into a git-ignored place such as work/):\n"
        f"before:\n{before or '(clean)'}\nafter:\n{after or '(clean)'}"
    )
