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


# A reader never scrolls a wall of code without a sentence. A lecture holds at most about 450 lines
# of code, and at most about 60 between two cells of prose. A line of code is a non-blank line of a
# code cell that is not a comment (a comment on its own line explains, and costs the reader no
# code), or a line of code a cell prints: a script's functions, a diff, a file's lines.
MAX_RUN_LINES = 60
MAX_LECTURE_CODE_LINES = 450
# What prints code: the course's excerpt and diff helpers, and a shell command that prints a file.
PRINTS_CODE = re.compile(r"(?<![\w.])(show|show_changes)\(|^!(cat|head|tail|sed) ", re.M)
WORD = re.compile(r"[A-Za-z][\w'’-]*")


def is_code(line: str) -> bool:
    text = line.strip()
    return bool(text) and not text.startswith("#") and not text.startswith("%%writefile")


def printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def cell_code_lines(cell) -> int:
    lines = sum(map(is_code, cell.source.splitlines()))
    if PRINTS_CODE.search(cell.source):
        lines += sum(map(is_code, printed(cell).splitlines()))
    return lines


def says_something(cell) -> bool:
    """A markdown cell with a sentence in it: a heading, a table or a link alone says nothing about
    the code that follows."""
    for line in cell.source.splitlines():
        text = line.strip()
        if text.startswith(("#", "|")):
            continue
        if len(WORD.findall(text)) >= 8:
            return True
    return False


def code_runs(path) -> list[tuple[int, str]]:
    """(lines, where) for every run of code cells between two cells of prose."""
    runs, lines, first = [], 0, None
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            first = first or cell.source[:60].replace("\n", " | ")
            lines += cell_code_lines(cell)
        elif says_something(cell) and lines:
            runs.append((lines, first))
            lines, first = 0, None
    return runs + ([(lines, first)] if lines else [])


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_fits_one_sitting(path):
    lines = sum(cell_code_lines(c) for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert lines <= MAX_LECTURE_CODE_LINES, f"{path.name}: {lines} lines of code, over {MAX_LECTURE_CODE_LINES}"


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_no_wall_of_code_without_a_sentence(path):
    walls = [f"{lines} lines from: {first}" for lines, first in code_runs(path) if lines > MAX_RUN_LINES]
    assert not walls, f"{path.name}: code without a sentence between (at most {MAX_RUN_LINES}):\n" + "\n".join(walls)


def test_the_wall_check_counts_what_a_cell_prints_and_wants_a_sentence(tmp_path):
    """The checks above check the reader's view: printed code counts, a heading is no prose."""
    code = "\n".join(f"x{i} = {i}" for i in range(40))
    shown = nbformat.v4.new_code_cell('show("../scripts/s.py", "f")')
    shown.outputs = [nbformat.v4.new_output("stream", text="\n".join(f"y{i} = {i}" for i in range(30)))]
    cells = [nbformat.v4.new_code_cell(code), nbformat.v4.new_markdown_cell("## A heading only"), shown]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    assert [lines for lines, _ in code_runs(path)] == [40 + 1 + 30]
    cells.insert(1, nbformat.v4.new_markdown_cell("The function below prints what each rank holds, in rank order."))
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    assert [lines for lines, _ in code_runs(path)] == [40, 1 + 30]


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_no_code_cell_reads_another_notebook(path):
    """A notebook's code stands on its own files (scripts/, work/), never on another notebook."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            named = set(re.findall(r"[\w./-]+\.ipynb", cell.source)) - {path.name}
            assert not named, f"{path.name} reads {sorted(named)}:\n{cell.source[:200]}"


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
    for source in cells:
        for call in re.findall(r"copy_scripts\(([^)]*)\)", source):
            provided |= set(re.findall(r"(\w+\.py)", call))
    needed = {name for source in cells for name in re.findall(r"\bwork/(\w+\.py)\b", source)}
    for versions in scripts.values():  # imports of a script beside it, the course's chapter scripts
        needed |= {
            m + ".py" for m in re.findall(r"^(?:from|import) ((?:c\d\d|train|bench|dist)_\w+)", versions[-1], re.M)
        }
    assert needed <= provided, f"{path.name} needs {sorted(needed - provided)} in work/ but does not write them"
