"""A notebook run twice in a row passes twice; two checkouts running notebooks at once never meet.

- The notebooks whose launches read back what a run left in work/ (checkpoints they resume from,
  files they append to, a sharded checkpoint they load) clear it first, in the cell. Each is run
  again under strict nbval in the same checkout, right after the suite's own run of it (in its
  unit of work, on the same worker: tests/harness/units_of_work.py; run on its own, the test runs
  it twice). 09 once failed this: a previous run's checkpoint made it resume a job that should
  have started afresh.
- Two checkouts of the course run chapter 00 (four launches, `torchrun --standalone` among them)
  at the same time: ports come from the operating system and work/ is each checkout's own, so
  both pass.

Both run pytest in a process of its own, bounded in time; it carries this run's mark, so an
interrupted suite stops it too (tests/harness/nothing_left_behind.py).
"""

import shutil
import sys
import threading
from pathlib import Path

import pytest

from harness.units_of_work import UnitsOfWork, in_unit_of, notebooks_run
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
RERUN = [
    "notebooks/08_sharding_zero_fsdp.ipynb",  # saves and loads a sharded checkpoint
    "notebooks/09_fault_tolerance_and_debugging.ipynb",  # resumes from checkpoints, crashes, hangs
    "notebooks/10_multi_node_and_clusters.ipynb",  # two emulated nodes resume from a checkpoint
    "notebooks/11c_capstone_on_a_cluster.ipynb",  # resumes from the checkpoints its runs save
    "solutions/lab04_ddp_bug_hunt.ipynb",  # every run appends to final.pt.writers
    "solutions/lab09_resume_exactly.ipynb",  # a crashed job resumes from its checkpoint
]
TIMEOUT = 900  # s: 09 takes 1 minute here, longer on a loaded machine


def nbval(notebook: str, cwd: Path) -> tuple[int, str]:
    result = run_bounded([sys.executable, "-m", "pytest", "-q", notebook], timeout=TIMEOUT, cwd=cwd)
    return result.returncode, result.stdout + result.stderr


# The id puts each run in its notebook's unit of work: on the worker that ran the notebook, after it.
@pytest.mark.parametrize("notebook", RERUN, ids=in_unit_of)
def test_a_notebook_passes_twice_in_a_row(notebook, request):
    units = UnitsOfWork(ROOT)
    assert units.of(request.node.nodeid) == units.of(f"{notebook}::Cell 0")
    # The suite has not run it in this process: a first run.
    if notebook not in notebooks_run(request.config):
        rc, out = nbval(notebook, ROOT)
        assert rc == 0, f"first run of {notebook} failed:\n{out[-5000:]}"
    rc, out = nbval(notebook, ROOT)
    assert rc == 0, f"{notebook} failed when run again in the same checkout:\n{out[-5000:]}"


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
