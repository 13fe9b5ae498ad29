"""Nothing left behind: a run stops what it started, however it ends.

- Every process the suite starts inherits the run's mark (``PARALLEL_COURSE_TEST_RUN``),
  orphans included.
- On SIGTERM (a CI time-out), SIGHUP or Ctrl-C, and at the end of every run, each process
  carrying the mark is killed. Launches run in sessions of their own (so that a time-out can
  kill a launcher with its workers), and notebook kernels too, so a signal to the suite's
  process group alone would not reach them.
- The aftermath, once every test has run (and every worker has stopped): a process still
  alive or a changed working tree fails the run.
"""

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

RUN_MARK = "PARALLEL_COURSE_TEST_RUN"
# The pid of the session that owns the mark: it alone stops the marked processes and checks the
# aftermath. A pytest run that a test starts inherits both and owns nothing (it would otherwise
# stop the suite's own workers when it ends); a test that wants a run of its own gives it a new
# mark and no owner (tests/harness/test_interrupts.py).
RUN_OWNER = "PARALLEL_COURSE_TEST_RUN_OWNER"
# Kernels and workers get this long to shut down before the aftermath counts them (a run of the
# harness's own tests, whose process never ends, sets less: the variable below).
GRACE_VAR = "PARALLEL_COURSE_AFTERMATH_GRACE_S"
GRACE_S = 15


@dataclass(frozen=True)
class Run:
    """This process's part in the run."""

    mark: str
    # Whether this process owns the run: the one session that started it, not a worker of it
    # and not a pytest run that one of its tests started.
    owner: bool
    # The working tree before the first test (None outside a git checkout, or not the owner).
    git_status_before: str | None


RUN = pytest.StashKey[Run]()


def git_status(checkout: Path) -> str | None:
    """``git status --porcelain`` of the checkout, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=checkout,
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


def is_worker(config) -> bool:
    """True in a pytest-xdist worker; False in the process that runs the session (or the only one)."""
    return hasattr(config, "workerinput")


def stop_on_signal(run: Run):
    """A signal handler that stops the run's processes (in the owner) and then the run itself."""

    def handler(signum, frame):
        if run.owner:
            kill_marked_processes(run.mark)
        # pytest reports an interrupted run, runs its teardown, and exits non-zero.
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    return handler


def pytest_configure(config):
    # A worker, or a run that a test started: the mark and its owner are inherited.
    nested = RUN_MARK in os.environ and RUN_OWNER in os.environ
    owner = not nested and not is_worker(config)
    if owner:
        # Set before the workers start: they inherit both.
        os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
        os.environ[RUN_OWNER] = str(os.getpid())
    # Only the owner checks the aftermath, so only it needs the tree as it was.
    run = Run(os.environ.get(RUN_MARK, ""), owner, git_status(config.rootpath) if owner else None)
    config.stash[RUN] = run
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop_on_signal(run))


def pytest_unconfigure(config):
    # Runs after a normal end and after Ctrl-C alike. In a normal run the aftermath has already
    # failed the run on any survivor; this only makes sure nothing is left either way. Only in the
    # owner: a worker that finished first would stop the other, a nested run the whole suite.
    run = config.stash.get(RUN, None)
    if run is not None and run.owner:
        kill_marked_processes(run.mark)


def aftermath_problems(run: Run, checkout: Path) -> list[str]:
    """What the finished suite left behind: processes carrying its mark (given GRACE_S to end),
    and changes to the working tree (when the checkout is a git one)."""
    import psutil

    deadline = time.monotonic() + float(os.environ.get(GRACE_VAR, GRACE_S))
    left = alive_marked_processes(run.mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = alive_marked_processes(run.mark)
    problems = []
    for proc in left:
        try:
            command = " ".join(proc.cmdline())[:120]
            # Reported, and never left running.
            proc.kill()
        except psutil.Error:
            continue
        problems.append(f"a process started by the suite is still alive: pid {proc.pid}: {command}")
    before, after = run.git_status_before, git_status(checkout)
    if before is not None and after != before:
        problems.append(
            "the suite changed the working tree (write into a git-ignored place such as work/):\n"
            f"before:\n{before or '(clean)'}\nafter:\n{after or '(clean)'}"
        )
    return problems


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session, exitstatus):
    # After every other sessionfinish hook: pytest-xdist's has stopped the workers by then.
    result = yield
    run = session.config.stash[RUN]
    if not run.owner or exitstatus == pytest.ExitCode.INTERRUPTED:
        return result
    problems = aftermath_problems(run, session.config.rootpath)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.section("aftermath: the suite left something behind", sep="=", red=True)
            for problem in problems:
                reporter.write_line("FAILED " + problem)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
