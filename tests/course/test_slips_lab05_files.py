"""Lab 05's DDP is checked before BucketedDDP is written: each class has a file of its own, and the
launcher of check cells refuses a check only for a stub in what the checker imports (it imports the
file of the class it checks, when it checks it). The checks themselves: tests/launches/test_slips_lab05.py."""

from pathlib import Path

import nbformat

from lab_injection import ROOT, run_cell, script
from parallel_course.launch import unfinished

LAB = "lab05_build_your_own_ddp.ipynb"


def test_check_1_runs_while_bucketed_ddp_is_still_a_stub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Every file the lab writes, as handed out (stubs), then DDP's as the student finished it.
    for cell in nbformat.read(ROOT / "labs" / LAB, as_version=4).cells:
        if cell.cell_type == "code" and cell.source.startswith("%%writefile"):
            run_cell(cell.source, {})
    work = Path("work")
    (work / "lab05_my_ddp.py").write_text(script(LAB, "lab05_my_ddp.py"))
    assert unfinished(work / "lab05_my_bucketed_ddp.py") == work / "lab05_my_bucketed_ddp.py"
    assert unfinished(work / "lab05_check.py") is None
