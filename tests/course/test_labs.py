"""Labs are generated from solutions, and each lab stops only where the student has work to do.

A solution cell of a lab raises NotImplementedError when run. A solution cell that writes a
script (``%%writefile``) cannot raise; the check cell that launches the script raises
NotImplementedError for it (``parallel_course.launch.torchrun``).
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from labgen import is_solution_cell

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def test_labs_are_what_the_generator_makes():
    result = subprocess.run(
        [sys.executable, "tools/make_labs.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_solution_has_a_lab():
    solutions = {p.name for p in (ROOT / "solutions").glob("*.ipynb")}
    assert solutions == {p.name for p in LABS}


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_lab_stops_only_at_not_implemented(lab):
    nb = nbformat.read(lab, as_version=4)
    NotebookClient(
        nb, timeout=60, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(lab.parent)}}
    ).execute()

    def error(cell):
        return next((o for o in cell.get("outputs", []) if o.output_type == "error"), None)

    code = [c for c in nb.cells if c.cell_type == "code"]
    todo = [c for c in code if is_solution_cell(c)]
    assert todo, "a lab needs at least one cell for the student to complete"
    for cell in todo:
        if cell.source.startswith("%%writefile"):
            continue  # it only writes the file; the check cell that runs it raises
        err = error(cell)
        assert err is not None and err.ename == "NotImplementedError", (
            f"a solution cell should stop with NotImplementedError, got "
            f"{err.ename + ': ' + err.evalue if err else 'no error'}:\n{cell.source}"
        )
    first = next(c for c in code if error(c))
    assert error(first).ename == "NotImplementedError", (
        f"the first error must be the student's NotImplementedError, but this cell failed "
        f"with {error(first).ename}: {error(first).evalue}\n{first.source}"
    )


def _solution_regions(source):
    """The code between ### BEGIN SOLUTION and ### END SOLUTION, one list of lines per region."""
    regions, current = [], None
    for line in source.splitlines():
        if "### BEGIN SOLUTION" in line:
            current = []
        elif "### END SOLUTION" in line:
            regions.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return regions


def _distinctive(lines):
    """Lines that say something: whitespace normalised, no comments, no short lines like `return x`."""
    normal = (" ".join(line.split()) for line in lines)
    return [line for line in normal if len(line) >= 20 and not line.startswith(("#", '"""'))]


def test_no_lab_answer_is_shown_outside_solutions():
    """A lab's answer (its solution regions) appears in no lecture, script or package module.

    A region counts as shown when most of its distinctive lines (60 %, at least 2) appear in one
    other file; a bug-hunt's fixed script shares the course's conventions with the lectures, but
    never most of its lines."""
    shown = {}
    for path in [
        *(ROOT / "notebooks").glob("*.ipynb"),
        *(ROOT / "scripts").rglob("*.py"),
        *(ROOT / "src").rglob("*.py"),
    ]:
        text = (
            "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
            if path.suffix == ".ipynb"
            else path.read_text()
        )
        shown[path.relative_to(ROOT)] = {" ".join(line.split()) for line in text.splitlines()}
    leaks = []
    for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(solution, as_version=4).cells:
            for region in _solution_regions(cell.source):
                lines = _distinctive(region)
                for where, seen in shown.items():
                    hits = [line for line in lines if line in seen]
                    if len(hits) >= max(2, 0.6 * len(lines)):
                        leaks.append(
                            f"{solution.name}: {len(hits)} of {len(lines)} lines of an answer are in {where}, "
                            f"e.g. {hits[0]!r}"
                        )
    assert not leaks, "\n".join(leaks)
