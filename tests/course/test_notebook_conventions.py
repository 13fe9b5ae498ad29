"""The conventions every notebook keeps (opening, closing, kernel, ignored outputs; see the
instructor guide, notebooks/README.md), and the explorers reacting to their controls."""

import re
from pathlib import Path

import nbformat
import pytest

from helpers import LABS, LECTURES, SOLUTIONS, chapter
from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parents[2]
ALL = LECTURES + SOLUTIONS + LABS


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_standard_kernel_and_no_stored_widget_state(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert "widgets" not in nb.metadata, "stored widget state: re-store outputs with make outputs"


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_outputs_are_ignored_only_where_they_describe_the_machine(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if "NBVAL_IGNORE_OUTPUT" in cell.source:
            code = [line for line in cell.source.splitlines() if line.strip() and not line.startswith("#")]
            assert code in (["machine.versions()"], ["machine.report()"]), cell.source


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_opens_and_closes_the_course_way(path):
    cells = nbformat.read(path, as_version=4).cells
    assert cells[0].source.startswith(f"# {chapter(path)} · ")
    opening = cells[1].source
    for part in ("**After this notebook you can**", "**Time**", "**Prerequisites**", "**Runs on**"):
        assert part in opening, f"{path.name}: opening lacks {part}"
    assert any("machine.versions()" in c.source for c in cells[:5])
    assert cells[-1].source.startswith("## What you have now")


# One lecture per sitting: at most about 450 lines of code (non-blank lines of its code cells that are
# not comments: a comment on its own line explains, and costs the reader no code), and no code cell
# longer than a screen and a half (a long script is written in parts: %%writefile, then %%writefile -a).
MAX_CELL_LINES = 100
MAX_LECTURE_CODE_LINES = 450


def code_lines(path):
    cells = nbformat.read(path, as_version=4).cells
    return sum(
        1
        for c in cells
        if c.cell_type == "code"
        for line in c.source.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_fits_one_sitting(path):
    lines = code_lines(path)
    assert lines <= MAX_LECTURE_CODE_LINES, f"{path.name}: {lines} lines of code, over {MAX_LECTURE_CODE_LINES}"


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_no_code_cell_over_a_screen(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            n = len(cell.source.splitlines())
            assert n <= MAX_CELL_LINES, (
                f"{path.name}: a code cell of {n} lines (at most {MAX_CELL_LINES}; write a script in parts with "
                f"%%writefile -a):\n{cell.source[:200]}"
            )


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_notebook_runs_on_its_own(path):
    """A student may open any notebook first: every script of work/ that it runs, or that a script
    it writes imports, is written by this notebook or copied into work/ by it, never left there by
    an earlier notebook."""
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    scripts = written_scripts(path)
    provided = set(scripts) | {
        name for source in cells for name in re.findall(r"copy\([^)]*?(\w+\.py)[\"'], [\"']work/", source)
    }
    needed = {name for source in cells for name in re.findall(r"\bwork/(\w+\.py)\b", source)}
    for versions in scripts.values():  # imports of a script beside it, the course's chapter scripts
        needed |= {m + ".py" for m in re.findall(r"^(?:from|import) ((?:c\d\d|train|bench)_\w+)", versions[-1], re.M)}
    assert needed <= provided, f"{path.name} needs {sorted(needed - provided)} in work/ but does not write them"
