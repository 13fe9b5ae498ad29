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

ROOT = Path(__file__).resolve().parent.parent
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def test_labs_are_what_the_generator_makes():
    result = subprocess.run(
        [sys.executable, "tools/make_labs.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_solution_has_a_lab():
    solutions = {p.name for p in (ROOT / "solutions").glob("*.ipynb")}
    assert solutions == {p.name for p in LABS}


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_lab_stops_only_at_not_implemented(lab):
    nb = nbformat.read(lab, as_version=4)
    NotebookClient(
        nb, timeout=60, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(lab.parent)}},
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
