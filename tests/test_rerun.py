"""A notebook run twice in a row passes twice; two checkouts running notebooks at once never meet.

- 09 restarts jobs from checkpoints it writes into work/ itself. A previous run's files there once
  made it resume a job that should have started afresh, and fail strict nbval the second time.
  This test runs it again under strict nbval, after the suite's own run of it has filled work/
  (run on its own, the test runs it twice). Every notebook's launches that read such files back
  (09, 10, lab 09, lab 04, 08's sharded checkpoint) clear them first; 09 has the most.
- Two checkouts of the course run chapter 00 (four launches, `torchrun --standalone` among them)
  at the same time: ports come from the operating system and work/ is each checkout's own, so
  both pass.

Both run pytest in a process of its own, bounded in time; it carries this run's mark, so an
interrupted suite stops it too (conftest.py).
"""

import shutil
import sys
import threading
from pathlib import Path

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/09_fault_tolerance_and_debugging.ipynb"
TIMEOUT = 900  # s: 09 takes 1.5-2 minutes here, longer on a loaded machine


def nbval(notebook: str, cwd: Path) -> tuple[int, str]:
    result = run_bounded([sys.executable, "-m", "pytest", "-q", notebook], timeout=TIMEOUT, cwd=cwd)
    return result.returncode, result.stdout + result.stderr


def test_a_notebook_passes_twice_in_a_row():
    if not (ROOT / "notebooks" / "work" / "c09_ref_ckpt").exists():  # not run yet: a first run
        rc, out = nbval(NOTEBOOK, ROOT)
        assert rc == 0, f"first run of {NOTEBOOK} failed:\n{out[-5000:]}"
    rc, out = nbval(NOTEBOOK, ROOT)
    assert rc == 0, f"{NOTEBOOK} failed when run again in the same checkout:\n{out[-5000:]}"


def test_two_checkouts_run_a_notebook_at_once(tmp_path):
    for name in ("a", "b"):
        checkout = tmp_path / name
        for path in ("pyproject.toml", "tests/sanitize.cfg", "notebooks/00_setup_check.ipynb"):
            (checkout / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, checkout / path)
    results = {}

    def run(name):
        try:
            results[name] = nbval("notebooks/00_setup_check.ipynb", tmp_path / name)
        except Exception as e:  # a time-out: reported below, with the other checkout's result
            results[name] = (None, repr(e))

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, (rc, out) in sorted(results.items()):
        assert rc == 0, f"checkout {name} failed while the other ran:\n{out[-5000:]}"
        assert (tmp_path / name / "notebooks" / "work" / "hello_allreduce.py").exists()
