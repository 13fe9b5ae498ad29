"""The test harness itself: strict nbval catches a crashed launch; make refuses an old Python."""

import shutil
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]


def run_nbval_on_launch(tmp_path, script_body: str):
    """Strict nbval on a one-cell notebook whose stored output is a successful launch's."""
    script = tmp_path / "job.py"
    script.write_text(script_body)
    cell = new_code_cell(f"!{sys.executable} {script}")
    cell.execution_count = 1
    # `!cmd` output reaches the notebook through a pty, hence \r\n
    cell.outputs = [new_output("stream", name="stdout", text="OK: every rank holds the sum\r\n")]
    nb = new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "launch.ipynb")
    return run_bounded(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--nbval",
            "--nbval-current-env",
            "--nbval-sanitize-with",
            str(ROOT / "tests/sanitize.cfg"),
            "--nbval-cell-timeout",
            "60",
            "-c",
            "/dev/null",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "launch.ipynb"),
        ],
        timeout=120,
        cwd=tmp_path,
    )


def test_strict_nbval_fails_when_a_launch_crashes(tmp_path):
    """`!cmd` never fails its cell; the stored output is what catches a crash."""
    result = run_nbval_on_launch(tmp_path, "import sys\nsys.exit('worker crashed')\n")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "worker crashed" in result.stdout


def test_strict_nbval_passes_when_the_launch_succeeds(tmp_path):
    result = run_nbval_on_launch(tmp_path, "print('OK: every rank holds the sum')\n")
    assert result.returncode == 0, result.stdout[-3000:]


def test_make_refuses_an_old_python_with_a_clear_message(tmp_path):
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.9.18'; fi\nexit 1\n")
    fake.chmod(0o755)
    result = run_bounded([shutil.which("make"), "-s", "-C", str(ROOT), "check-python", f"PYTHON={fake}"], timeout=60)
    assert result.returncode != 0
    assert "needs Python 3.11 or newer" in result.stdout
    assert "Python 3.9.18" in result.stdout


def test_a_worker_runs_each_file_whole_and_the_files_sharing_work_names_together():
    """make test's two workers (conftest.py): a notebook's cells in one kernel, in order, then the test
    that runs it again; 04 and 09, which write different train_ddp.py into notebooks/work/, together."""
    from conftest import RERUN_TEST, SHARED_WORK, unit_of_work

    lecture = "notebooks/10_multi_node_and_clusters.ipynb"
    assert unit_of_work(f"{lecture}::Cell 4") == lecture
    assert unit_of_work(f"{RERUN_TEST}{lecture}]") == lecture
    assert unit_of_work("tests/launches/test_launch.py::test_x[a::b]") == "tests/launches/test_launch.py"
    assert (
        unit_of_work("tests/launches/test_rerun.py::test_two_checkouts_run_a_notebook_at_once")
        == "tests/launches/test_rerun.py"
    )
    shared = {unit_of_work(f"{path}::Cell 1") for path in SHARED_WORK}
    assert shared == {unit_of_work(f"{RERUN_TEST}notebooks/09_fault_tolerance_and_debugging.ipynb]")}
    assert len(shared) == 1 and "notebooks/04_distributed_data_parallel.ipynb" in SHARED_WORK
