"""A likely slip injected into a lab's solution, and the FAIL line its checker gives for it.

The slip is a textual substitution of the solution's own code, read at test time: a test never
holds a copy of the answer. ``cell`` reads a solution's cell, ``region`` the code of one of its
solution regions, ``injected`` makes the substitution (the text it replaces must appear exactly
once), ``first_failure`` runs cells in this process, in order, and returns the message of the
first check that failed. ``script`` reads the last version of a script a solution writes
(``%%writefile``), for checkers that launch processes.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from parallel_course.checks import CheckFailed
from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"


def cell(notebook: str, cell_id: str) -> str:
    """The source of the cell ``cell_id`` of ``solutions/notebook``."""
    for c in nbformat.read(SOLUTIONS / notebook, as_version=4).cells:
        if c.get("id") == cell_id:
            return c.source
    raise KeyError(f"{notebook} has no cell {cell_id}")


def script(notebook: str, name: str) -> str:
    """The text of the script ``name`` as ``solutions/notebook`` last writes it."""
    return written_scripts(SOLUTIONS / notebook)[name][-1]


def region(source: str, index: int = 0) -> str:
    """The code of the ``index``-th solution region of ``source``, between its BEGIN and END markers."""
    begin, end = "### BEGIN SOLUTION\n", "### END SOLUTION"
    start = 0
    for _ in range(index + 1):
        start = source.index(begin, start) + len(begin)
    return source[start : source.index(end, start)]


def injected(source: str, old: str, new: str) -> str:
    """``source`` with ``old`` replaced by ``new``; ``old`` must appear exactly once."""
    assert source.count(old) == 1, f"the slip's target appears {source.count(old)} times, not once: {old!r}"
    return source.replace(old, new)


def run_cell(source: str, namespace: dict) -> None:
    """Run one cell's source in ``namespace``: a ``%%writefile`` cell writes (or appends to) its file."""
    first, _, body = source.partition("\n")
    if first.startswith("%%writefile"):
        words = first.split()
        path = Path(words[-1])
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if "-a" in words else "w") as f:
            f.write(body + "\n")
        return
    exec(compile(source, "<lab cell>", "exec"), namespace)


def first_failure(sources: list[str], namespace: dict | None = None) -> str:
    """Run ``sources`` in order in one namespace; the message of the first check that fails."""
    namespace = {} if namespace is None else namespace
    for source in sources:
        try:
            run_cell(source, namespace)
        except CheckFailed as failed:
            return str(failed)
    pytest.fail("no check failed: the injected slip went unnoticed")


def fail_lines(output: str) -> list[str]:
    """The FAIL lines of a checker's output."""
    return [line for line in output.splitlines() if "FAIL" in line]


@contextlib.contextmanager
def kernel_in(folder: Path):
    """Cells run as in a kernel started in ``folder``; what their setup changes in this process (the
    environment, the working directory, the import path and the modules imported from ``folder``,
    torch's threads and random state) is put back afterwards."""
    modules = set(sys.modules)
    threads, state, py_state = torch.get_num_threads(), torch.get_rng_state(), random.getstate()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "path", list(sys.path))
        for name in ("PATH", "OMP_NUM_THREADS"):
            # setenv records the value to put back (none: the variable is removed again).
            patch.setenv(name, os.environ.get(name, ""))
            if not os.environ[name]:
                patch.delenv(name)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.set_rng_state(state)
            random.setstate(py_state)
            # (still in ``folder``: a module imported through a relative path has a relative __file__)
            for name in set(sys.modules) - modules:
                file = getattr(sys.modules[name], "__file__", None)
                if file and Path(file).resolve().is_relative_to(Path(folder).resolve()):
                    del sys.modules[name]


@pytest.fixture
def in_kernel(tmp_path):
    """``kernel_in`` an empty folder, for one test."""
    with kernel_in(tmp_path):
        yield tmp_path
