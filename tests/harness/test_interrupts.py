"""Nothing left behind (nothing_left_behind.py): stopping a run half-way leaves no process behind,
and a run that leaves a process or a changed working tree fails.

A CI time-out sends SIGTERM to the suite's process group; a person presses Ctrl-C (SIGINT); a
student interrupts a notebook cell while ``!torchrun`` runs. In every case the launcher and its
workers must go too, although launches run in sessions of their own (so that a bounded launch can
kill a launcher together with its workers) and would otherwise outlive the process that started
them.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from harness.nothing_left_behind import GRACE_VAR, RUN_MARK, RUN_OWNER, alive_marked_processes, kill_marked_processes
from helpers import HARNESS_PATH, own_suite
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")

# Two workers that say they have started, then wait far longer than any test.
SLEEPER = """\
import os, pathlib, time
pathlib.Path(os.environ["READY_DIR"], "rank" + os.environ["RANK"]).touch()
time.sleep(600)
"""


# `python -m pytest` as run in a terminal, where Ctrl-C reaches it: with Python's own SIGINT handler
# even when this suite runs where SIGINT is ignored (a script's background job inherits that, and
# a Python started there keeps ignoring it: the SIGINT case would then wait for nothing).
FOREGROUND_PYTEST = (
    "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def fresh_env(tmp_path: Path) -> tuple[dict, str]:
    # This inner run's own mark, so only its processes are counted.
    mark = uuid.uuid4().hex
    env = dict(os.environ, OMP_NUM_THREADS="1", READY_DIR=str(tmp_path), PYTHONPATH=HARNESS_PATH)
    env[RUN_MARK] = mark
    # An inner suite of its own, which owns its mark.
    env.pop(RUN_OWNER, None)
    return env, mark


def inner_suite(tmp_path: Path, *args: str) -> list[str]:
    """pytest's arguments for a suite of its own in tmp_path, which leaves nothing behind."""
    return [*own_suite(tmp_path, "harness.nothing_left_behind"), *args]


def assert_nothing_left(mark: str, spare: set[int] = frozenset()) -> None:
    def left():
        return [p for p in alive_marked_processes(mark) if p.pid not in spare]

    try:
        wait_for(lambda: not left(), timeout=30, what="the launch's processes to end")
    finally:
        for proc in left():
            proc.kill()


@pytest.mark.parametrize(
    "signum, workers",
    [(signal.SIGTERM, []), (signal.SIGINT, []), (signal.SIGTERM, ["-n", "2"])],
    ids=["SIGTERM", "SIGINT", "SIGTERM-two-workers"],  # the last as `make test` runs: pytest-xdist
)
def test_stopping_the_suite_stops_its_launches(tmp_path, signum, workers):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "test_launch_and_wait.py").write_text(
        textwrap.dedent(f"""\
        from parallel_course.launch import run_bounded

        def test_a_long_launch():
            run_bounded([{TORCHRUN!r}, "--standalone", "--nproc_per_node=2", "sleeper.py"], timeout=600)
        """)
    )
    env, mark = fresh_env(tmp_path)
    suite = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND_PYTEST, *inner_suite(tmp_path, *workers, "test_launch_and_wait.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: len(list(tmp_path.glob("rank*"))) == 2 or suite.poll() is not None,
            timeout=180,
            what="both workers to start",
        )
        assert suite.poll() is None, suite.stdout.read()
        os.killpg(suite.pid, signum)  # as a CI time-out (SIGTERM) or Ctrl-C (SIGINT) would
        out, _ = suite.communicate(timeout=120)
        assert suite.returncode != 0, out
        assert_nothing_left(mark)
    finally:
        if suite.poll() is None:
            os.killpg(suite.pid, signal.SIGKILL)
        kill_marked_processes(mark)  # when the test failed: its launch must not outlive it


def test_interrupting_a_cell_stops_its_torchrun(tmp_path, request):
    from jupyter_client.manager import KernelManager

    from harness.unix_socket_kernels import FOLDER, unix_socket_kernel_manager

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env, mark = fresh_env(tmp_path)
    # Over Unix sockets, as nbval's kernels in this run: no TCP port to lose while it starts.
    km = unix_socket_kernel_manager(KernelManager, request.config.stash[FOLDER])(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=env)
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute(f"!{TORCHRUN} --standalone --nproc_per_node=2 sleeper.py")
        wait_for(lambda: len(list(tmp_path.glob("rank*"))) == 2, timeout=180, what="both workers to start")
        km.interrupt_kernel()  # what JupyterLab's stop button does
        deadline = time.monotonic() + 120
        while True:  # the cell ends: its execute_reply arrives
            reply = kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        kernel = km.provisioner.process.pid
        assert_nothing_left(mark, spare={kernel})
        assert km.is_alive(), "the kernel itself must survive an interrupt"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_run_that_leaves_a_process_behind_fails(tmp_path):
    """The aftermath: a test that starts a process and forgets it fails the run, though every test
    passed, and the process is stopped."""
    (tmp_path / "test_forgets_a_process.py").write_text(
        textwrap.dedent("""\
        import subprocess, sys

        def test_starts_a_process_and_forgets_it():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        """)
    )
    env, mark = fresh_env(tmp_path)
    # The process never ends: the aftermath's grace for processes that are ending would be waited
    # in full.
    env[GRACE_VAR] = "1"
    result = run_bounded(
        [sys.executable, "-m", "pytest", *inner_suite(tmp_path, "test_forgets_a_process.py")],
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1 and "1 passed" in result.stdout, result.stdout[-3000:]
    assert "aftermath: the suite left something behind" in result.stdout, result.stdout[-3000:]
    assert "time.sleep(600)" in result.stdout, result.stdout[-3000:]
    assert_nothing_left(mark)


def test_a_run_that_changes_the_working_tree_fails(tmp_path):
    """The aftermath: a test that writes into the checkout, outside a git-ignored place, fails the
    run, though every test passed; what it changed is named."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".gitignore").write_text("work/\n__pycache__/\n")
    (checkout / "test_writes.py").write_text(
        textwrap.dedent("""\
        from pathlib import Path

        def test_writes_into_work_and_beside_it():
            Path("work").mkdir(exist_ok=True)
            Path("work", "fine.txt").write_text("ignored by git")
            Path("stray.txt").write_text("left in the checkout")
        """)
    )
    for git in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *git], cwd=checkout, check=True, capture_output=True)
    env, mark = fresh_env(tmp_path)
    result = run_bounded(
        [sys.executable, "-m", "pytest", *inner_suite(checkout, "test_writes.py")], timeout=180, cwd=checkout, env=env
    )
    assert result.returncode == 1 and "1 passed" in result.stdout, result.stdout[-3000:]
    assert "the suite changed the working tree" in result.stdout, result.stdout[-3000:]
    assert "?? stray.txt" in result.stdout and "fine.txt" not in result.stdout, result.stdout[-3000:]
