"""Suite-wide pytest hooks.

- ``make test`` runs the suite in two worker processes (pytest-xdist, ``-n auto``: at most 2):
  each test file and notebook is one unit of work, run whole by one worker; files that share
  names in one ``work/`` folder form one unit, run in order (``SHARED_WORK``).
- Every process the suite starts inherits ``PARALLEL_COURSE_TEST_RUN``, orphans included.
- An interrupted run leaves nothing behind: on SIGTERM (a CI time-out), SIGHUP or Ctrl-C, and
  at the end of every run, each process carrying this run's mark is killed. Launches run in
  sessions of their own (so that a time-out can kill a launcher with its workers), and notebook
  kernels too, so a signal to the suite's process group alone would not reach them.
- The aftermath, once every test has run (and every worker has stopped): the suite must leave
  no process and no file behind. A survivor or a changed working tree fails the run.
- Cheap tests are handed out first: the lint, unit tests, then notebooks, then the launch-heavy
  test files.
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

import pytest

ROOT = Path(__file__).resolve().parent
# The authoring tools (labs from solutions, script export) live in tools/, outside the package
# students import; the tests that check them import them from there.
sys.path.insert(0, str(ROOT / "tools"))
# What several test folders share (helpers, browser) sits in tests/.
sys.path.insert(0, str(ROOT / "tests"))
RUN_MARK = "PARALLEL_COURSE_TEST_RUN"
# The pid of the session that owns the mark: it alone stops the marked processes and checks the
# aftermath. A pytest run that a test starts inherits both and owns nothing (it would otherwise
# stop the suite's own workers when it ends); a test that wants a run of its own gives it a new
# mark and no owner (tests/harness/test_interrupts.py).
RUN_OWNER = "PARALLEL_COURSE_TEST_RUN_OWNER"
_owner = False  # whether this process owns the run: set by pytest_configure
# Files that write the same names into one work/ folder: one unit of work, run in this order.
# 04 and 09 each write their own version of notebooks/work/train_ddp.py.
SHARED_WORK = ("notebooks/04_distributed_data_parallel.ipynb", "notebooks/09_fault_tolerance_and_debugging.ipynb")
# Runs a notebook again, in its own folder (test_rerun.py): in the unit of that notebook, after it.
RERUN_TEST = "tests/launches/test_rerun.py::test_a_notebook_passes_twice_in_a_row["
NOTEBOOKS_RUN: set[str] = set()  # the notebooks whose cells this process has run
MAX_WORKERS = 2  # what the suite is tested with: a 2-core CI machine, one core of it busy or not
# Cheap checks of the whole checkout: first, so that a lint error shows in seconds.
EARLY = ("tests/course/test_lint.py",)
# Test files that launch many jobs (torchrun, JupyterLab, a browser): after the notebooks.
HEAVY = (
    "tests/launches/test_fault_tolerance.py",
    "tests/browser/test_jupyterlab.py",
    "tests/browser/test_slides.py",
    "tests/course/test_labs.py",
    "tests/launches/test_train_ddp.py",
    "tests/launches/test_bench_scripts.py",
    "tests/launches/test_cluster.py",
    "tests/harness/test_interrupts.py",
    "tests/launches/test_rerun.py",
    "tests/launches/test_world_sizes.py",
    "tests/launches/test_nccl_paths.py",
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


def alive_marked_processes(mark: str) -> list:
    """The ``marked_processes`` still running: not ended, not a zombie waiting for its parent."""
    import psutil

    def alive(proc):
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return [proc for proc in marked_processes(mark) if alive(proc)]


def _stop_on_signal(signum, frame):
    if _owner:
        kill_marked_processes(os.environ[RUN_MARK])
    # pytest reports an interrupted run, runs its teardown, and exits non-zero.
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def is_worker(config) -> bool:
    """True in a pytest-xdist worker; False in the process that runs the session (or the only one)."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    global _owner
    nested = RUN_MARK in os.environ and RUN_OWNER in os.environ  # a worker, or a run a test started
    _owner = not nested and not is_worker(config)
    if _owner:  # set before the workers start: they inherit both
        os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
        os.environ[RUN_OWNER] = str(os.getpid())
    config.stash_git_status = git_status()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown when it is not loaded
def pytest_xdist_auto_num_workers(config):
    return min(MAX_WORKERS, os.cpu_count() or 1)


def pytest_unconfigure(config):
    # Runs after a normal end and after Ctrl-C alike. In a normal run the aftermath has already
    # failed the run on any survivor; this only makes sure nothing is left either way. Only in the
    # owner: a worker that finished first would stop the other, a nested run the whole suite.
    if _owner:
        kill_marked_processes(os.environ[RUN_MARK])


def aftermath_problems(git_status_before: str | None) -> list[str]:
    """What the finished suite left behind: processes carrying its mark (given 15 s to end), and
    changes to the working tree (when the checkout is a git one)."""
    import psutil

    deadline = time.monotonic() + 15  # kernels and workers get a moment to shut down
    left = alive_marked_processes(os.environ[RUN_MARK])
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = alive_marked_processes(os.environ[RUN_MARK])
    problems = []
    for proc in left:
        try:
            command = " ".join(proc.cmdline())[:120]
            proc.kill()  # never leave it running
        except psutil.Error:
            continue
        problems.append(f"a process started by the suite is still alive: pid {proc.pid}: {command}")
    after = git_status()
    if git_status_before is not None and after != git_status_before:
        problems.append(
            "the suite changed the working tree (write into a git-ignored place such as work/):\n"
            f"before:\n{git_status_before or '(clean)'}\nafter:\n{after or '(clean)'}"
        )
    return problems


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session, exitstatus):
    # After every other sessionfinish hook: pytest-xdist's has stopped the workers by then.
    result = yield
    if not _owner or exitstatus == pytest.ExitCode.INTERRUPTED:
        return result
    problems = aftermath_problems(session.config.stash_git_status)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.section("aftermath: the suite left something behind", sep="=", red=True)
            for problem in problems:
                reporter.write_line("FAILED " + problem)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path.startswith(EARLY):
        return -1
    if path.startswith(HEAVY):
        return 2
    if path.endswith(".ipynb"):
        return 1
    return 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: the order inside each group is kept


def unit_of_work(nodeid: str) -> str:
    """What one worker runs whole, in order: a test file or notebook (with the test that runs it
    again), or the SHARED_WORK notebooks together."""
    path = nodeid.split("::", 1)[0]
    if nodeid.startswith(RERUN_TEST):  # [notebooks/NN_name.ipynb]
        path = nodeid[len(RERUN_TEST) : -1]
    return "shared work/ names" if path in SHARED_WORK else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown when it is not loaded
def pytest_xdist_make_scheduler(config, log):
    # pytest-xdist's own --dist loadgroup renames the items, and nbval then restarts the kernel
    # before every cell; a scheduler that only groups them leaves the items as they are.
    from xdist.scheduler import LoadScopeScheduling

    class ByUnitOfWork(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return unit_of_work(nodeid)

    return ByUnitOfWork(config, log)


def pytest_runtest_logreport(report):
    # In the session's process, the workers' reports too.
    path = report.nodeid.split("::", 1)[0]
    _seconds_per_file[path] += report.duration
    if path.endswith(".ipynb"):
        NOTEBOOKS_RUN.add(path)


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
