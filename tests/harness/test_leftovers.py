"""leftovers.py: an earlier run's leftovers planted before a notebook's one run, and checked after it.

The negative control is a notebook that resumes from the latest checkpoint it finds without
clearing its folder: it fails under the suite, where the same notebook clearing first passes."""

import os
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from harness.leftovers import (
    STALE,
    longer_run,
    named_in_work,
    plant,
    problems_after,
    read_record,
    record_path,
    snapshot,
    write_record,
)
from helpers import HARNESS_PATH, own_suite
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]


def test_a_longer_run_leaves_its_numbers_as_nines():
    assert longer_run("ckpt_single/step-000004/__0_0.distcp") == "ckpt_single/step-999999/__9_9.distcp"
    # The notebook's own name in work/ stays; a path without a number further on has no longer run.
    assert longer_run("c09_ckpt/last.pt") is None and longer_run("c06_trace_rank0.json") is None


def test_planted_files_are_stale_and_an_earlier_runs_real_files_stay(tmp_path):
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "last.pt").write_bytes(b"a real earlier run's checkpoint")
    planted = plant(work, ["ckpt/last.pt", "out/step-2/state.txt", "log.txt"])
    assert sorted(planted) == ["log.txt", "out/step-2/state.txt", "out/step-9/state.txt"]
    assert all((work / name).read_bytes() == STALE for name in planted)
    assert (work / "ckpt" / "last.pt").read_bytes() == b"a real earlier run's checkpoint"


def test_what_a_run_did_to_the_leftovers(tmp_path):
    """Appending to a planted file fails; files the run neither cleared nor wrote go; a record
    that is no longer what the run leaves, under the names the notebook owns, fails."""
    work = tmp_path / "work"
    record = ["run/metrics.json", "run/step-4/state.txt", "log.txt", "gone.txt"]
    planted = plant(work, record)
    before = snapshot(work)
    # The run: clears run/ and writes it again with one more file, appends to log.txt, never
    # writes gone.txt; the other worker's notebook writes its own file.
    for name in ("run/metrics.json", "run/step-4/state.txt", "run/step-9/state.txt"):
        (work / name).unlink()
    (work / "run" / "metrics.json").write_text("{}")
    (work / "run" / "step-4" / "state.txt").write_text("4")
    (work / "run" / "extra.txt").write_text("new")
    with open(work / "log.txt", "ab") as log:
        log.write(b"this run\n")
    (work / "other.txt").write_text("another notebook's")
    problems = problems_after(work, record, planted, before, owned={"run", "log.txt", "gone.txt"})
    assert problems[0].startswith("work/log.txt: the run added to an earlier run's file")
    assert problems[1].splitlines()[1:] == ["  left, not recorded: run/extra.txt", "  recorded, not left: gone.txt"]
    assert len(problems) == 2, problems
    # The stale file nothing touched is gone; the run's own files stay.
    assert not (work / "gone.txt").exists() and (work / "run" / "extra.txt").exists()


def test_a_record_lists_data_only_and_reads_back(tmp_path):
    work = tmp_path / "work"
    for name in ("run/final.pt", "run/__pycache__/x.cpython-311.pyc", "job.py", "job.err"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("x")
    path = record_path(tmp_path, "notebooks/n.ipynb")
    assert path == tmp_path / "tests" / "leftovers" / "notebooks" / "n.txt"
    write_record(path, "notebooks/n.ipynb", sorted(snapshot(work)))
    assert read_record(path) == ["job.err", "run/final.pt"]
    assert read_record(tmp_path / "none.txt") is None


def test_the_names_a_notebook_owns_in_work_are_the_literal_ones_of_its_code(tmp_path):
    nb = new_notebook(
        cells=[
            new_code_cell("!torchrun x.py --out work/c09_ref --checkpoint-dir work/c09_ref_ckpt > work/c09.out"),
            new_code_cell('load(f"work/gpt_{layout}/final.pt"); copy("work/dist_setup.py"); ls("work/.")'),
            new_code_cell("%%writefile work/job.py\n# torchrun job.py --out work/ref"),
        ]
    )
    nbformat.write(nb, tmp_path / "n.ipynb")
    assert named_in_work(tmp_path / "n.ipynb") == {"c09_ref", "c09_ref_ckpt", "c09.out"}


RESUMES = """\
from pathlib import Path
import shutil

ckpt = Path("work/{name}_ckpt")
{clear}ckpt.mkdir(parents=True, exist_ok=True)
(ckpt / "step-3").mkdir(exist_ok=True)
(ckpt / "step-3" / "state.txt").write_text("3")
# A job that resumes from the latest checkpoint in its folder.
latest = max(ckpt.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
print("resumed from", latest.name, "at step", int((latest / "state.txt").read_text()))
"""


def test_a_notebook_that_does_not_clear_its_checkpoints_fails_and_one_that_does_passes(tmp_path):
    """As the suite runs them: both stored outputs are a first run's; the stale checkpoint of a
    longer run (step-9) is what the one that does not clear resumes from."""
    (tmp_path / "notebooks").mkdir()
    for name, clear in (("clears", "shutil.rmtree(ckpt, ignore_errors=True)\n"), ("resumes", "")):
        cell = new_code_cell(RESUMES.format(name=name, clear=clear))
        cell.execution_count = 1
        cell.outputs = [new_output("stream", name="stdout", text="resumed from step-3 at step 3\n")]
        nb = new_notebook(cells=[cell])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / "notebooks" / f"{name}.ipynb")
        write_record(record_path(tmp_path, f"notebooks/{name}.ipynb"), name, [f"{name}_ckpt/step-3/state.txt"])
    args = own_suite(tmp_path, "harness.leftovers", "harness.unix_socket_kernels")
    result = run_bounded(
        [sys.executable, "-m", "pytest", *args, "--nbval", "--nbval-current-env", "-rA", "notebooks"],
        timeout=180,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=HARNESS_PATH),
    )
    out = result.stdout
    assert result.returncode == 1, out[-3000:]
    assert "PASSED notebooks/clears.ipynb::Cell 0" in out, out[-3000:]
    assert "FAILED notebooks/resumes.ipynb::Cell 0" in out and "ValueError" in out, out[-3000:]
    # What the suite planted and nothing rewrote is gone again.
    assert not (tmp_path / "notebooks" / "work" / "clears_ckpt" / "step-9").exists()


def test_the_names_a_course_notebook_owns_in_work_are_its_own_outside_its_unit():
    """The two workers plant into, and count, only what each notebook owns: never another's."""
    from harness.leftovers import owned_names
    from harness.units_of_work import UnitsOfWork

    units = UnitsOfWork(ROOT)
    for folder in ("notebooks", "solutions"):
        owners = {}
        for notebook in sorted((ROOT / folder).glob("*.ipynb")):
            path = notebook.relative_to(ROOT).as_posix()
            record = read_record(record_path(ROOT, path)) or []
            for name in owned_names(notebook, record):
                owners.setdefault(name, set()).add(units.of(f"{path}::Cell 0"))
        shared = {name: sorted(unit) for name, unit in owners.items() if len(unit) > 1}
        assert not shared, f"{folder}/work: names of more than one unit of work: {shared}"


def test_every_record_belongs_to_a_notebook():
    for record in (ROOT / "tests" / "leftovers").rglob("*.txt"):
        notebook = record.relative_to(ROOT / "tests" / "leftovers").with_suffix(".ipynb")
        assert (ROOT / notebook).is_file(), f"{record}: no notebook {notebook}"
