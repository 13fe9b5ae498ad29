"""Slips injected into a lab's solution script, the variants written beside the lab's checker, and
all of them checked in one launch (tests/slip_driver.py); tests/lab_injection.py has the rest.

A slip is a list of substitutions (old, new) applied to the solution as the notebook holds it,
read at test time: the tests keep no copy of an answer, and a substitution that no longer matches
the solution fails the test instead of testing nothing.
"""

import json
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import nbformat

from helpers import launch
from lab_injection import injected
from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).with_name("slip_driver.py")

Substitutions = list[tuple[str, str]]


def inject(text: str, substitutions: Substitutions) -> str:
    """``text`` with each ``old`` (found exactly once) replaced by its ``new``, in order."""
    for old, new in substitutions:
        text = injected(text, old, new)
    return text


def lab_folder(solution: str, folder: Path) -> Path:
    """The scripts that ``solution`` (solutions/NAME.ipynb) writes, as its work/ folder holds them,
    with the course's setup module beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts" / "dist_setup.py", folder)
    for name, versions in written_scripts(ROOT / "solutions" / solution).items():
        (folder / name).write_text(versions[-1])
    return folder


def write_variants(folder: Path, student: str, slips: dict[str, Substitutions]) -> list[str]:
    """Beside ``student`` (``lab11_zero3``), one module per slip (``lab11_zero3_sum``): their names."""
    text = (folder / f"{student}.py").read_text()
    for name, substitutions in slips.items():
        (folder / f"{student}_{name}.py").write_text(inject(text, substitutions))
    return [f"{student}_{name}" for name in slips]


def launch_two(script: Path, *args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python script args`` in 2 processes that join one group by env:// as torchrun's workers
    would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), without torchrun's agent: seconds less per
    launch. One bounded job (helpers.launch), both killed together on a time-out; its exit code is
    the first non-zero one of the two."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    worker = " ".join(shlex.quote(str(a)) for a in [sys.executable, script, *args])
    both = (
        f"RANK=0 LOCAL_RANK=0 {worker} & first=$!; RANK=1 LOCAL_RANK=1 {worker}; second=$?; "
        "wait $first; first=$?; exit $(( first ? first : second ))"
    )
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    return launch(["bash", "-c", both], cwd=cwd, timeout=timeout, **env)


def check_variants(
    folder: Path,
    checker: str,
    student: str,
    slips: dict[str, Substitutions],
    once=(),
    constants: dict[str, int] | None = None,
    timeout: float = 300,
) -> dict[str, dict]:
    """Each slip's variant checked by ``checker``'s main(), all in one launch on 2 processes:
    {slip: {"code", "output", "error"}}. ``once``: functions of the checker run once for all
    variants; ``constants``: the checker's constants changed (tests/slip_driver.py)."""
    names = write_variants(folder, student, slips)
    args = [folder / checker, student, *names]
    args += ["--once", *once] if once else []
    args += ["--set", *(f"{k}={v}" for k, v in constants.items())] if constants else []
    result = launch_two(DRIVER, *args, cwd=folder, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith('{"variant"'):
            record = json.loads(line)
            found[record.pop("variant")[len(student) + 1 :]] = record
    assert found.keys() == slips.keys(), result.stdout[-3000:] + result.stderr[-3000:]
    return found


def fail_lines(record: dict) -> list[str]:
    """The FAIL lines a checker wrote."""
    return [line for line in record["output"].splitlines() if line.startswith("FAIL")]


def assert_fail_names(record: dict, *words: str) -> None:
    """The variant's check failed (it ran to its end) and one FAIL line holds every word."""
    assert record["error"] is None, record["error"]
    assert record["code"] == 1, record["output"]
    named = [line for line in fail_lines(record) if all(w in line for w in words)]
    assert named, f"no FAIL line names {list(words)}:\n{record['output']}"


def code_cell(solution: str, marker: str) -> str:
    """The source of the one code cell of ``solution`` that holds ``marker``."""
    cells = [
        c.source
        for c in nbformat.read(ROOT / "solutions" / solution, as_version=4).cells
        if c.cell_type == "code" and marker in c.source
    ]
    assert len(cells) == 1, f"{len(cells)} cells of {solution} hold {marker!r}"
    return cells[0]
