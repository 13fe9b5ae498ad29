import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from parallel_course.launch import free_port, in_colab, notebook_launch, run_bounded, setup_notebook


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

    monkeypatch.setattr(launch, "run_bounded", lambda *a, **k: pytest.fail("launched a script that cannot work yet"))
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


def test_with_busy_core_runs_the_command_and_stops_its_hog():
    tool = Path(__file__).resolve().parents[2] / "tools" / "with_busy_core.py"
    code = "import os, psutil; print(sorted(c.pid for c in psutil.Process(os.getppid()).children()))"
    result = subprocess.run(
        [sys.executable, str(tool), sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    hog = int(result.stdout.split("pids ")[1].split(")")[0])
    assert str(hog) in result.stdout.splitlines()[-1], "the hog runs beside the command"
    assert not psutil.pid_exists(hog) or psutil.Process(hog).status() == psutil.STATUS_ZOMBIE


# torchrun's report of a job in which rank 1 raised and rank 0, waiting in a collective, lost it.
REPORT = """\
[rank1]: RuntimeError: injected failure: rank 1 in step 14
E1125 12:51:28.891000 14829 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train_ddp.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_12:51:28
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 14833)  (SIGTERM)
  error_file: /tmp/torchelastic_91t4ewz3/cceb85d7_dpugwo4y/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
      loss.backward()
  RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:40886.
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_12:51:28
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 14834)
  error_file: /tmp/torchelastic_91t4ewz3/cceb85d7_dpugwo4y/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
      raise RuntimeError(f"injected failure: rank {rank} in step {step}")
  RuntimeError: injected failure: rank 1 in step 14
============================================================
"""


def test_failed_ranks_reads_every_entry_of_torchruns_report():
    from parallel_course.launch import failed_ranks

    found = failed_ranks(REPORT)
    assert sorted(found) == [0, 1]
    assert found[1] == [
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 14834)",
        "  error_file: .../attempt_0/1/error.json",
        "  traceback : Traceback (most recent call last):",
        '      raise RuntimeError(f"injected failure: rank {rank} in step {step}")',
        "  RuntimeError: injected failure: rank 1 in step 14",
    ]
    assert "Connection closed by peer" in found[0][-1] and not any("time " in line for line in found[0])
    assert failed_ranks("no report here") == {}


class ColabShell:
    """What str(get_ipython()) shows in Google Colab: how Accelerate and the course tell it."""

    def __str__(self):
        return "<google.colab._shell.Shell object at 0x7f0>"


def write_identity(folder):
    """A launched function: it records its process and the world size its launcher gave it."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / str(os.getpid())).write_text(os.environ.get("WORLD_SIZE", "unset"))


def identities(folder):
    return sorted((int(p.name), p.read_text()) for p in Path(folder).iterdir())


def test_notebook_launch_starts_the_processes_in_colab_where_notebook_launcher_runs_once(tmp_path, monkeypatch):
    import IPython
    from accelerate import notebook_launcher

    monkeypatch.setattr(IPython, "get_ipython", lambda: ColabShell(), raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert in_colab()
    # Colab without 2 GPUs: Accelerate calls the function once, here, however many processes were asked for.
    notebook_launcher(write_identity, args=(tmp_path / "accelerate",), num_processes=2, use_port=free_port())
    assert identities(tmp_path / "accelerate") == [(os.getpid(), "unset")]
    notebook_launch(write_identity, args=(tmp_path / "course",), num_processes=2)
    launched = identities(tmp_path / "course")
    assert len(launched) == 2 and all(pid != os.getpid() and world == "2" for pid, world in launched), launched


def test_in_colab_is_false_in_jupyter_and_outside_it(monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None, raising=False)
    assert not in_colab()
