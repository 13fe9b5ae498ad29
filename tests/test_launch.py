import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from parallel_course.launch import run_bounded, setup_notebook


def test_setup_notebook_creates_work_dir_and_sets_threads(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    setup_notebook()
    assert (tmp_path / "work").is_dir()
    assert os.environ["OMP_NUM_THREADS"] == "1"
    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_setup_notebook_keeps_the_users_thread_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    setup_notebook(work_dir=str(tmp_path / "w"))
    assert os.environ["OMP_NUM_THREADS"] == "3"


def test_setup_notebook_rejects_zero_threads(tmp_path):
    with pytest.raises(ValueError, match="threads_per_process must be >= 1"):
        setup_notebook(work_dir=str(tmp_path), threads_per_process=0)


def test_run_bounded_returns_output_and_exit_code():
    result = run_bounded([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], timeout=30)
    assert (result.returncode, result.stdout) == (3, "hi\n")


@pytest.mark.parametrize("own_session", [False, True], ids=["same-group", "own-session"])
def test_run_bounded_kills_the_launcher_and_its_workers_on_timeout(tmp_path, own_session):
    """A worker in the launcher's process group, or in a session of its own as torchrun starts
    its workers: both must die with the launcher."""
    pidfile = tmp_path / "grandchild.pid"
    # A child that starts a grandchild and then both sleep: a hung launcher and its worker.
    code = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        f" start_new_session={own_session});"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid));"
        "time.sleep(60)"
    )
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([sys.executable, "-c", code], timeout=3)
    assert time.monotonic() - start < 15
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_run_bounded_rejects_a_non_positive_timeout():
    with pytest.raises(ValueError, match="timeout must be positive"):
        run_bounded(["true"], timeout=0)


def test_torchrun_returns_the_workers_output(tmp_path):
    from parallel_course.launch import torchrun

    script = tmp_path / "job.py"
    script.write_text("import os\nif os.environ['RANK'] == '0': print('world', os.environ['WORLD_SIZE'])\n")
    assert torchrun(str(script), world_size=2) == "world 2\n"


def test_torchrun_raises_on_a_failed_job_and_on_a_stub(tmp_path):
    from parallel_course.launch import LaunchFailed, torchrun

    failing = tmp_path / "fail.py"
    failing.write_text("raise ValueError('bad worker')\n")
    with pytest.raises(LaunchFailed, match="bad worker"):
        torchrun(str(failing), world_size=1)
    unwritten = tmp_path / "unwritten.py"  # a worker that fails on NotImplementedError
    unwritten.write_text("def f():\n    raise NotImplementedError('to do')\n\n\nf()\n")
    with pytest.raises(NotImplementedError):
        torchrun(str(unwritten), world_size=1)


def test_torchrun_does_not_launch_a_lab_script_with_a_stub(tmp_path, monkeypatch):
    """A lab's stub, in the script or a module beside it that it imports: no launch, at once."""
    from parallel_course import launch

    monkeypatch.setattr(
        launch, "run_bounded_retrying_exit_crash", lambda *a, **k: pytest.fail("launched a script that cannot work yet")
    )
    (tmp_path / "mine.py").write_text("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()\n")
    (tmp_path / "check.py").write_text("import os\n\nfrom mine import f\n\nf()\n")
    with pytest.raises(NotImplementedError, match="mine.py still has code to write"):
        launch.torchrun(str(tmp_path / "check.py"), world_size=2)
    assert launch.unfinished(tmp_path / "check.py") == tmp_path / "mine.py"
    (tmp_path / "mine.py").write_text("def f():\n    return 1\n")
    assert launch.unfinished(tmp_path / "check.py") is None


def test_torchrun_restarts_the_job_when_asked(tmp_path):
    from parallel_course.launch import LaunchFailed, torchrun

    script = tmp_path / "flaky.py"  # fails on the first attempt, succeeds on the restart
    script.write_text(
        "import os, sys\n"
        "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0': sys.exit('first attempt fails')\n"
        "print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
    )
    with pytest.raises(LaunchFailed, match="first attempt fails"):
        torchrun(str(script), world_size=1)
    assert torchrun(str(script), world_size=1, max_restarts=1) == "attempt 1\n"
    with pytest.raises(ValueError, match="max_restarts"):
        torchrun(str(script), max_restarts=-1)


def _script_failing_first(tmp_path, message, failures=1):
    """A script that writes `message` to stderr and fails on its first `failures` runs."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        f"flag = {str(tmp_path / 'ran')!r}\n"
        "runs = int(open(flag).read()) + 1 if os.path.exists(flag) else 1\n"
        "open(flag, 'w').write(str(runs))\n"
        "print('done')\n"
        f"if runs <= {failures}:\n    sys.stderr.write({message!r} + '\\n')\n    sys.exit(134)\n"
    )
    return script


def test_the_known_exit_crash_is_run_again_up_to_three_runs(tmp_path):
    from parallel_course.launch import EXIT_CRASH, run_bounded_retrying_exit_crash

    before = []
    script = _script_failing_first(tmp_path, EXIT_CRASH, failures=2)
    result = run_bounded_retrying_exit_crash(
        [sys.executable, str(script)], timeout=30, before_each=lambda: before.append(1)
    )
    assert result.returncode == 0 and (tmp_path / "ran").read_text() == "3" and len(before) == 3


def test_an_exit_crash_every_time_is_returned_after_the_last_run(tmp_path):
    from parallel_course.launch import EXIT_CRASH, run_bounded_retrying_exit_crash

    script = _script_failing_first(tmp_path, EXIT_CRASH, failures=5)
    result = run_bounded_retrying_exit_crash([sys.executable, str(script)], timeout=30, attempts=2)
    assert result.returncode == 134 and EXIT_CRASH in result.stderr and (tmp_path / "ran").read_text() == "2"
    with pytest.raises(ValueError, match="attempts"):
        run_bounded_retrying_exit_crash([sys.executable, str(script)], timeout=30, attempts=0)


def test_other_failures_are_not_run_again(tmp_path):
    from parallel_course.launch import run_bounded_retrying_exit_crash

    script = _script_failing_first(tmp_path, "ValueError: a real bug")
    result = run_bounded_retrying_exit_crash([sys.executable, str(script)], timeout=30)
    assert result.returncode == 134 and (tmp_path / "ran").read_text() == "1"


def test_with_busy_core_runs_the_command_and_stops_its_hog():
    tool = Path(__file__).resolve().parent.parent / "tools" / "with_busy_core.py"
    code = "import os, psutil; print(sorted(c.pid for c in psutil.Process(os.getppid()).children()))"
    result = subprocess.run(
        [sys.executable, str(tool), sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    hog = int(result.stdout.split("pids ")[1].split(")")[0])
    assert str(hog) in result.stdout.splitlines()[-1], "the hog runs beside the command"
    assert not psutil.pid_exists(hog) or psutil.Process(hog).status() == psutil.STATUS_ZOMBIE


def test_torchrun_passes_before_each_to_every_run(tmp_path, monkeypatch):
    from parallel_course import launch

    seen = {}

    def fake(cmd, timeout, **kwargs):
        seen.update(kwargs)
        return subprocess.CompletedProcess(cmd, 0, "ok\n", "")

    monkeypatch.setattr(launch, "run_bounded_retrying_exit_crash", fake)
    script = tmp_path / "job.py"
    script.write_text("print('ok')\n")
    hook = lambda: None  # noqa: E731
    assert launch.torchrun(str(script), before_each=hook) == "ok\n" and seen["before_each"] is hook
