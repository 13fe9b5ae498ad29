"""Suite-wide pytest hooks.

- Every process the suite starts inherits ``PARALLEL_COURSE_TEST_RUN``; the aftermath tests
  (run last) look for survivors by that mark, orphans included.
- An interrupted run leaves nothing behind: on SIGTERM (a CI time-out), SIGHUP or Ctrl-C, and
  at the end of every run, each process carrying this run's mark is killed. Launches run in
  sessions of their own (so that a time-out can kill a launcher with its workers), and notebook
  kernels too, so a signal to the suite's process group alone would not reach them.
- The git status at the start is kept, so the aftermath tests can tell whether the suite left
  files behind.
- Cheap tests run first: the lint, unit tests, then notebooks, then the launch-heavy test
  files; the aftermath checks last.
- At the end, the time of every test file and notebook is printed, slowest last.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The authoring tools (labs from solutions, script export) live in tools/, outside the package
# students import; the tests that check them import them from there.
sys.path.insert(0, str(ROOT / "tools"))
RUN_MARK = "PARALLEL_COURSE_TEST_RUN"
AFTERMATH = "tests/test_zz_aftermath.py"
# Cheap checks of the whole checkout: first, so that a lint error shows in seconds.
EARLY = ("tests/test_lint.py",)
# Test files that launch many jobs (torchrun, JupyterLab, a browser): after the notebooks.
HEAVY = (
    "tests/test_fault_tolerance.py",
    "tests/test_jupyterlab.py",
    "tests/test_slides.py",
    "tests/test_labs.py",
    "tests/test_train_ddp.py",
    "tests/test_bench_scripts.py",
    "tests/test_cluster.py",
    "tests/test_interrupts.py",
    "tests/test_rerun.py",
)

_seconds_per_file: dict[str, float] = defaultdict(float)


def git_status() -> str | None:
    """``git status --porcelain`` of the checkout, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def marked_processes(mark: str) -> list:
    """Every process other than this one whose environment carries ``mark``, orphans included."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_MARK) == mark:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def kill_marked_processes(mark: str) -> int:
    """Kill what this run started (launchers, workers, kernels, servers); return how many."""
    import psutil

    procs = marked_processes(mark)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


def _stop_on_signal(signum, frame):
    kill_marked_processes(os.environ[RUN_MARK])
    # pytest reports an interrupted run, runs its teardown, and exits non-zero.
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def pytest_configure(config):
    os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
    config.stash_git_status = git_status()
    config.stash_start = time.time()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)


def pytest_unconfigure(config):
    # Runs after a normal end and after Ctrl-C alike. In a normal run the aftermath test has
    # already failed on any survivor; this only makes sure nothing is left either way.
    kill_marked_processes(os.environ[RUN_MARK])


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path.startswith(AFTERMATH):
        return 3
    if path.startswith(EARLY):
        return -1
    if path.startswith(HEAVY):
        return 2
    if path.endswith(".ipynb"):
        return 1
    return 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: the order inside each group is kept


def pytest_runtest_logreport(report):
    _seconds_per_file[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _seconds_per_file:
        return
    tr = terminalreporter
    tr.section("time per test file and notebook (slowest last)")
    for path, seconds in sorted(_seconds_per_file.items(), key=lambda kv: kv[1]):
        tr.write_line(f"{seconds:7.1f} s  {path}")
    notebooks = sum(s for p, s in _seconds_per_file.items() if p.endswith(".ipynb"))
    tr.write_line(f"{notebooks:7.1f} s  all notebooks")
    tr.write_line(f"{sum(_seconds_per_file.values()):7.1f} s  everything")
