"""What several test files share: the course's notebooks in order, scripts loaded as modules, launched
as a fresh job would be or run until they join a process group, stored outputs sanitized and
compared, and a pytest run of its own for the tests of the harness."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
# Where the harness plugins are found (``harness.timing``...), for a pytest run of its own.
HARNESS_PATH = str(ROOT / "tests")
# What a launcher tells the processes it starts, cleared before every launch: a job starts as it
# would from a fresh shell, whatever the suite's own environment holds (a shell where someone
# tried a launch by hand, a job scheduler's allocation, the suite run under a launcher). torchrun
# sets them again for its workers; a plain `python` run must see none of them.
LAUNCHER_VARIABLES = (
    # dist_setup.setup() joins env:// when RANK is set (waiting for a group that never forms);
    # scripts refuse a count or size their work from WORLD_SIZE.
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    # The device each process takes (cuda:LOCAL_RANK) and whether every process gets a GPU.
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    # The node's rank: chapter 10's script reads it to tell a torchrun launch from another.
    "GROUP_RANK",
    # A restart of torchrun's: train_ddp.py resumes from its checkpoint when the count is above 0,
    # and setup() connects to torchrun's own store when told to use it.
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
    # Changes what a collective checks and prints (chapter 09's mismatch demo sets it itself).
    "TORCH_DISTRIBUTED_DEBUG",
)
# 00_setup_check.ipynb ... 06a_timing_and_bandwidth.ipynb ...: a chapter number, a letter where a
# chapter has several lectures, then the name.
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def chapter(notebook: Path) -> str:
    """'06a' for 06a_timing_and_bandwidth.ipynb."""
    return notebook.name.split("_")[0]


def load_script(path: Path | str):
    """A script of scripts/ (or any path) imported as a module, without running its main(); it finds
    the scripts beside it, as under `python script.py`."""
    path = ROOT / "scripts" / path if isinstance(path, str) else path
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def job_environment(**extra: str) -> dict[str, str]:
    """The environment of a fresh job: this one without LAUNCHER_VARIABLES, one thread per process
    (two or more processes share a few cores), then ``extra``."""
    env = {key: value for key, value in os.environ.items() if key not in LAUNCHER_VARIABLES}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def job_command(script: Path | str, nproc: int | None, *args) -> list[str]:
    """``python script args`` for ``nproc`` None, else ``torchrun --standalone
    --nproc_per_node=nproc script args`` (a free port each time)."""
    launcher = [sys.executable] if nproc is None else [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}"]
    return [*launcher, str(script), *(str(arg) for arg in args)]


def launch(cmd: list, cwd: Path = ROOT, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd`` as a fresh job (``job_environment``), bounded in time: run_bounded kills
    the launcher and its workers together. A job past its time fails the test with its last words."""
    try:
        return run_bounded([str(c) for c in cmd], timeout=timeout, cwd=cwd, env=job_environment(**extra_env))
    except subprocess.TimeoutExpired as e:
        command = " ".join(map(str, cmd))
        pytest.fail(f"{command} did not finish within {timeout} s; its last words:\n{(e.stderr or '')[-3000:]}")


def survivors(marker: str) -> list[psutil.Process]:
    """Processes whose command line mentions ``marker`` (a folder unique to one launch)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def own_suite(folder: Path, *plugins: str) -> list[str]:
    """pytest's arguments for a suite of its own in ``folder``, apart from this repository's
    configuration, with the harness plugins named (``harness.timing``...): run it with
    ``PYTHONPATH=HARNESS_PATH``, where they are found."""
    loaded = [arg for plugin in plugins for arg in ("-p", plugin)]
    return [*loaded, "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(folder), "-q"]


def sanitize(text: str) -> str:
    """``text`` with tests/sanitize.cfg applied, as strict nbval applies it to stored and fresh outputs."""
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns((ROOT / "tests" / "sanitize.cfg").read_text()):
        text = re.sub(regex, replace, text)
    return text


NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def report_differences(stored: str, fresh: str, rtol: float = 1e-3) -> list[str]:
    """Where two runs' outputs disagree once sanitized, word for word, except that numbers may differ
    by ``rtol`` relative: the float rounding of other hardware (a GPU against the CPU that stored the
    output). One entry per line that differs; an empty list when they agree."""
    stored_lines, fresh_lines = sanitize(stored).splitlines(), sanitize(fresh).splitlines()
    problems = []
    if len(stored_lines) != len(fresh_lines):
        problems.append(f"{len(fresh_lines)} lines where the stored output has {len(stored_lines)}")
    for old, new in zip(stored_lines, fresh_lines):
        if NUMBER.sub("#", old) != NUMBER.sub("#", new):
            problems.append(f"expected {old!r}, got {new!r}")
            continue
        for a, b in zip(NUMBER.findall(old), NUMBER.findall(new)):
            if abs(float(a) - float(b)) > rtol * max(abs(float(a)), abs(float(b))):
                problems.append(f"{a} became {b} in {new!r}")
                break
    return problems


# Runs scripts in one process, each as __main__ (or one of its functions), until it joins a process
# group: init_process_group records its arguments and ends the script there. Optionally with fake GPUs.
_UNTIL_JOINED = r"""
import contextlib, io, json, os, runpy, sys
import torch
import torch.distributed as dist
import torch.multiprocessing


class Joined(Exception):
    pass


joins, devices = [], []


def recording_init(backend=None, *args, **kwargs):
    device_id = kwargs.get("device_id")
    joins.append({"backend": backend, "device_id": None if device_id is None else str(device_id)})
    raise Joined


def recording_set_device(device):
    devices.append(str(torch.device("cuda", device) if isinstance(device, int) else device))


fake_gpus, runs, launcher_variables = (json.loads(arg) for arg in sys.argv[1:4])
if fake_gpus:
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: fake_gpus
    torch.cuda.set_device = recording_set_device
dist.init_process_group = recording_init
dist.TCPStore = lambda *args, **kwargs: dist.HashStore()  # torchrun's agent store, here in memory


def in_process_spawn(fn, args=(), nprocs=1, **kwargs):
    # mp.spawn's worker of index 1 (or 0), run here: the join it makes is the one recorded.
    fn(min(1, nprocs - 1), *args)


torch.multiprocessing.spawn = in_process_spawn
found = []
for run in runs:
    for key in launcher_variables:
        os.environ.pop(key, None)
    os.environ.update(run["environment"])
    joins.clear()
    devices.clear()
    sys.argv, stderr = run["argv"], io.StringIO()
    sys.path.insert(0, os.path.dirname(run["argv"][0]))
    try:
        with contextlib.redirect_stderr(stderr):
            if run.get("call"):
                runpy.run_path(run["argv"][0])[run["call"]](*run["args"])
            else:
                runpy.run_path(run["argv"][0], run_name="__main__")
        stopped = "finished without joining a group"
    except Joined:
        stopped = "joined a group"
    except SystemExit as e:
        stopped = f"exit {e.code if isinstance(e.code, int) else 1}"
        if not isinstance(e.code, int | None):
            stderr.write(str(e.code) + "\n")
    except BaseException as e:
        stopped = f"{type(e).__name__}: {e}"
    errors = [line for line in stderr.getvalue().splitlines() if ": error: " in line]
    found.append({"stopped": stopped, "joins": list(joins), "set_device": list(devices), "errors": errors})
print(json.dumps(found))
"""


def run_until_joined(runs: list[dict], cwd: Path, fake_gpus: int = 0) -> list[dict]:
    """How each run stopped: ``{"stopped", "joins", "set_device", "errors"}``, in the order given.

    A run is ``{"argv": [script, *args], "environment": {...}}``, optionally with ``"call"`` (a function
    of the script to call with ``"args"`` instead of running it as __main__). All in one subprocess,
    which imports torch once; with ``fake_gpus``, torch.cuda reports that many GPUs and records
    ``set_device``. A script that starts its workers with mp.spawn runs its worker of index 1 here.
    ``stopped`` is "joined a group", "exit N" (a refusal: ``errors`` holds its "<script>: error: ..."
    lines), "finished without joining a group" or the exception raised.
    """
    result = subprocess.run(
        [sys.executable, "-c", _UNTIL_JOINED, *map(json.dumps, (fake_gpus, runs, LAUNCHER_VARIABLES))],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])
