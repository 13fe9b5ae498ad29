"""Make a notebook's ``!torchrun`` cells behave the same on every machine."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

WORK_DIR = "work"  # git-ignored: every file a notebook writes goes here


def setup_notebook(work_dir: str = WORK_DIR, threads_per_process: int = 1) -> None:
    """Prepare the kernel's environment for launching worker processes.

    - creates ``work_dir`` (git-ignored) for the scripts that ``%%writefile`` cells write;
    - puts this Python's ``bin`` folder first on ``PATH`` so that ``!torchrun`` and
      ``!python`` are the course environment's, even when Jupyter was started without
      activating it;
    - sets ``OMP_NUM_THREADS`` for the workers (unless the user already did), so that N
      processes do not fight over the cores and torchrun does not print its warning.
    """
    if threads_per_process < 1:
        raise ValueError(f"threads_per_process must be >= 1, got {threads_per_process}")
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + path
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process))
    Path(work_dir).mkdir(parents=True, exist_ok=True)


def run_bounded(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` to completion, or kill it *and every process it started* after ``timeout`` s.

    The command gets a process group of its own, so a launcher's workers are killed with it
    (``subprocess.run``'s own timeout kills only the direct child). Output is captured as text.
    Raises ``subprocess.TimeoutExpired`` after the group is killed.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    finally:
        if proc.poll() is None:  # interrupted (e.g. KeyboardInterrupt): leave nothing behind
            _kill_group(proc.pid)
    _kill_group(proc.pid)  # workers that outlived a launcher that has exited
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(pgid: int) -> None:
    """Kill a launcher's process group and every descendant, wherever its session.

    Killing the group alone is not enough: torchrun starts each worker in a session of its own,
    so a killed torchrun would leave its workers running as orphans.
    """
    try:
        import psutil

        descendants = psutil.Process(pgid).children(recursive=True)
    except Exception:  # already gone, or psutil missing: the group kill below still runs
        descendants = []
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in descendants:
        try:
            proc.kill()
        except Exception:  # psutil.NoSuchProcess and friends: it ended on its own
            pass


class LaunchFailed(RuntimeError):
    """A torchrun launch exited with an error; the message ends with the workers' last lines."""


# What nbgrader's generate step (make labs) leaves where a lab's answer goes.
STUB = re.compile(r"# YOUR CODE HERE[ \t]*\n[ \t]*raise NotImplementedError\(\)")


def unfinished(script: str | Path) -> Path | None:
    """The script, or a module beside it that it imports (a lab's ``work/*.py``), that still has a
    ``# YOUR CODE HERE`` stub; None when there is none."""
    todo, seen = [Path(script)], set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(errors="replace")
        if STUB.search(text):
            return path
        todo += [path.parent / f"{name}.py" for name in re.findall(r"(?m)^\s*(?:from|import)\s+(\w+)", text)]
    return None


def torchrun(script: str, *args: str, world_size: int = 2, timeout: float = 60, max_restarts: int = 0) -> str:
    """Run ``torchrun --standalone --nproc_per_node=world_size [--max-restarts=N] script args...``, bounded.

    For check cells, where a failure must fail the cell (``!torchrun`` never does): prints and
    returns the workers' standard output; raises ``LaunchFailed`` with the end of their error
    output if the job fails, or ``NotImplementedError`` if a ``# YOUR CODE HERE`` stub is still to
    be written: at once when the script or a module beside it still has one (no launch needed to
    know it will fail), else when the workers failed on one.
    """
    stub = unfinished(script)
    if stub is not None:
        raise NotImplementedError(f"{stub.name} still has code to write (# YOUR CODE HERE)")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    bin_dir = Path(sys.executable).parent
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    cmd = [str(bin_dir / "torchrun"), "--standalone", f"--nproc_per_node={world_size}", *restarts, script, *args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        result = run_bounded(cmd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise LaunchFailed(f"{script} did not finish within {timeout:g} s (hung collective?)") from None
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        if "NotImplementedError" in result.stderr:
            raise NotImplementedError(f"{script} still has code to write (# YOUR CODE HERE)")
        # The workers' own traceback comes before torchrun's first log line ("E1122 07:26:50...").
        worker_err = re.split(r"(?m)^[EWI]\d{4} \d\d:\d\d", result.stderr)[0]
        tail = "\n".join([line for line in worker_err.splitlines() if line.strip()][-10:])
        # With restarts, that traceback is the first attempt's; what ended the job is at the end.
        if max_restarts:
            end = "\n".join([line for line in result.stderr.splitlines() if line.strip()][-15:])
            tail += f"\n... and the end of torchrun's output:\n{end}"
        raise LaunchFailed(f"{script} failed with exit code {result.returncode}:\n{tail}")
    return result.stdout


def failed_ranks(report: str) -> dict[int, list[str]]:
    """The entries of torchrun's failure report (what it writes to stderr when a job fails), one per
    failed rank: rank -> the entry's lines without its time and host, the error file's path cut to
    ``.../attempt_N/R/error.json``. Empty if the text has no report."""
    found = {}
    for entry in re.split(r"(?m)^\[\d+\]:\n", report.split("Failures:", 1)[-1])[1:]:
        lines = [
            re.sub(r"error_file: /\S+/(attempt_\d+/\d+/error\.json)", r"error_file: .../\1", line.rstrip())
            for line in entry.splitlines()
            if line.strip() and not re.match(r"[-=]+$|Root Cause|\s+(time|host)\s+:", line)
        ]
        found[int(re.search(r"rank\s+: (\d+)", entry).group(1))] = lines
    return found


def free_port() -> str:
    """A port the operating system says is free right now (it picks one when we bind to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def in_colab() -> bool:
    """Whether this kernel is Google Colab's, told the way Accelerate tells it (accelerate/launchers.py)."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and "google.colab" in str(ipython.get_ipython())


def notebook_launch(function, args=(), num_processes: int = 2) -> None:
    """Accelerate's ``notebook_launcher(function, args, num_processes)``, on a free port, in processes.

    Two things of notebook_launcher's are fixed here. Its default port is always 29500, so two
    notebooks launching at once collide. And in Google Colab with fewer than 2 GPUs it launches
    nothing: it calls ``function`` once, in the kernel, a single process whatever
    ``num_processes`` says. There this makes the launch notebook_launcher makes everywhere else:
    torch's elastic agent, forking ``num_processes`` workers from the kernel, each with RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
    """
    import torch

    port = free_port()
    # device_count() asks NVML first: it does not initialise CUDA, so the kernel can still fork.
    if not in_colab() or torch.cuda.device_count() >= 2:
        from accelerate import notebook_launcher

        notebook_launcher(function, args=args, num_processes=num_processes, use_port=port)
        return
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=num_processes,
        run_id="notebook",
        rdzv_backend="static",
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs={"rank": 0},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="fork",
    )
    elastic_launch(config, entrypoint=function)(*args)
