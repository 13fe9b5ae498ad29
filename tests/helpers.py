"""What several test files share: the course's notebooks in order, scripts loaded as modules or run
until they join a process group, and stored outputs sanitized and compared."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


class Joined(Exception):
    pass


joins, devices = [], []


def recording_init(backend=None, *args, **kwargs):
    device_id = kwargs.get("device_id")
    joins.append({"backend": backend, "device_id": None if device_id is None else str(device_id)})
    raise Joined


def recording_set_device(device):
    devices.append(str(torch.device("cuda", device) if isinstance(device, int) else device))


fake_gpus, runs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if fake_gpus:
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: fake_gpus
    torch.cuda.set_device = recording_set_device
dist.init_process_group = recording_init
dist.TCPStore = lambda *args, **kwargs: dist.HashStore()  # torchrun's agent store, here in memory
found = []
for run in runs:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE"):
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
    ``set_device``. ``stopped`` is "joined a group", "exit N" (a refusal: ``errors`` holds its
    "<script>: error: ..." lines), "finished without joining a group" or the exception raised.
    """
    result = subprocess.run(
        [sys.executable, "-c", _UNTIL_JOINED, json.dumps(fake_gpus), json.dumps(runs)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])
