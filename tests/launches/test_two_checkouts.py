"""Two checkouts running notebooks at once never meet.

Two copies of the course (its notebook, configuration and test harness) run chapter 00 (four
launches, `torchrun --standalone` among them) at the same time: ports come from the operating
system, work/ is each checkout's own, and each kernel talks to its pytest over Unix sockets in a
folder of that run's own (tests/harness/unix_socket_kernels.py), so both pass. Each runs pytest in
a process of its own, bounded in time; it carries this run's mark, so an interrupted suite stops
it too (tests/harness/nothing_left_behind.py).

A notebook run on top of an earlier run's leftovers in work/ is tested in the suite's own run of
it: tests/harness/leftovers.py plants them first.
"""

import shutil
import sys
import threading
from pathlib import Path

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600  # s: chapter 00 takes under a minute, longer on a loaded machine
# A checkout as far as chapter 00 under pytest needs one: the notebook, the configuration, the
# harness the root conftest.py loads.
CHECKOUT = ("pyproject.toml", "conftest.py", "tests/sanitize.cfg", "tests/harness", "notebooks/00_setup_check.ipynb")


def nbval(notebook: str, cwd: Path) -> tuple[int, str]:
    result = run_bounded([sys.executable, "-m", "pytest", "-q", notebook], timeout=TIMEOUT, cwd=cwd)
    return result.returncode, result.stdout + result.stderr


def copy_checkout(checkout: Path) -> None:
    for path in CHECKOUT:
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / path).is_dir():
            shutil.copytree(ROOT / path, checkout / path, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / path, checkout / path)


def test_two_checkouts_run_a_notebook_at_once(tmp_path):
    for name in ("a", "b"):
        copy_checkout(tmp_path / name)
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
