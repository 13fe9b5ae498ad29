"""Units of work: what one pytest-xdist worker runs whole, and the order work is handed out in.

``make test`` runs the suite in two worker processes. Each unit of work is run whole, in order,
by one worker:

- a test file, or a notebook (its cells share one kernel);
- notebooks of one folder that write scripts of the same name into its ``work/`` folder (each
  its own version: they would overwrite each other's) form one unit, found from the notebooks'
  ``%%writefile`` cells;
- a test whose parameter id is ``in_unit_of(path)`` runs in the unit of ``path``, after it (a
  test that reads what a notebook or another test file leaves, on the worker that made it).

The order work is handed out in, cheap first so that a mistake shows in seconds: tests marked
``first`` (the lint); the other tests; the notebooks; then the ``heavy`` tests, which launch many
jobs (torchrun, notebooks, a browser). Every test in a folder of ``HEAVY_FOLDERS`` is heavy; a
test elsewhere says so with the marker. The heavy units go out longest first, by the seconds a
full run measured (``SECONDS``, the timing report's lines; a unit it does not name comes first,
as if the longest), so that the two workers end together instead of one running the last long
unit alone.
"""

import os
import re
from collections import defaultdict
from pathlib import Path

import pytest

from parallel_course.scriptdiff import written_scripts

# What the suite is tested with: a 2-core CI machine, one core of it busy or not.
MAX_WORKERS = 2
# The folders of tests/ whose tests launch jobs, by what they are: heavy, after the notebooks.
HEAVY_FOLDERS = ("launches", "browser", "harness")
# In a parameter id: the test runs in the unit of work of the path after it.
UNIT_ID = re.compile(r"\[unit=([^\]]+)\]$")
MARKERS = (
    "first: a quick check of the whole checkout, handed out before everything else (tests/harness/units_of_work.py)",
    "heavy: launches many jobs (torchrun, notebooks, a browser), handed out after the notebooks "
    "(tests/harness/units_of_work.py); every test in tests/launches, tests/browser, tests/harness is",
)
NOTEBOOKS_RUN = pytest.StashKey[set[str]]()
# The time report of a full run (tests/harness/timing.py): "  123.4 s  path" per file or notebook.
SECONDS = Path(__file__).with_name("seconds.txt")
REPORT_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?) s  (\S+)$")


def in_unit_of(path: str) -> str:
    """The parameter id of a test that must run in the unit of work of ``path`` (a notebook or a
    test file, relative to the repository root), on the same worker, after it."""
    return f"unit={path}"


def notebook_units(folder: Path, root: Path) -> dict[str, str]:
    """Each notebook of ``folder`` (its path relative to ``root``) -> its unit of work: the first,
    by name, of the notebooks it shares a written script's name with, directly or through others."""
    notebooks = sorted(path.relative_to(root).as_posix() for path in folder.glob("*.ipynb"))
    writers = defaultdict(list)
    for notebook in notebooks:
        try:
            names = written_scripts(root / notebook)
        except (OSError, ValueError):
            # A notebook that cannot be read fails its own test; here it writes nothing.
            names = {}
        for name in names:
            writers[name].append(notebook)
    # Union-find: each notebook points towards the first notebook of its unit.
    first = {notebook: notebook for notebook in notebooks}

    def find(notebook: str) -> str:
        while first[notebook] != notebook:
            notebook = first[notebook]
        return notebook

    for sharing in writers.values():
        roots = sorted({find(notebook) for notebook in sharing})
        for other in roots[1:]:
            first[other] = roots[0]
    return {notebook: find(notebook) for notebook in notebooks}


class UnitsOfWork:
    """The unit of work of a test id, for the repository at ``root``."""

    def __init__(self, root: Path):
        self.root = root
        # Folder -> its notebooks' units, read once per folder.
        self.by_folder: dict[str, dict[str, str]] = {}

    def of(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        unit_id = UNIT_ID.search(nodeid)
        if unit_id:
            path = unit_id.group(1)
        if not path.endswith(".ipynb"):
            return path
        folder = Path(path).parent.as_posix()
        if folder not in self.by_folder:
            self.by_folder[folder] = notebook_units(self.root / folder, self.root)
        return self.by_folder[folder].get(path, path)


def is_heavy_folder(path: str) -> bool:
    """Whether ``path`` (relative to the repository root) lies in a folder of HEAVY_FOLDERS."""
    parts = Path(path).parts
    return len(parts) > 2 and parts[0] == "tests" and parts[1] in HEAVY_FOLDERS


def rank(item) -> int:
    """Where a test comes in the order work is handed out: lower first."""
    if item.get_closest_marker("first"):
        return 0
    if item.get_closest_marker("heavy"):
        return 3
    if item.nodeid.split("::", 1)[0].endswith(".ipynb"):
        return 2
    return 1


def measured_seconds(text: str) -> dict[str, float]:
    """Seconds per test file or notebook, from the lines of a time report."""
    found = {}
    for line in text.splitlines():
        match = REPORT_LINE.match(line)
        if match and ("/" in match.group(2) or match.group(2).endswith((".py", ".ipynb"))):
            found[match.group(2)] = float(match.group(1))
    return found


def handed_out(items: list, units: "UnitsOfWork", seconds: dict[str, float]) -> list:
    """``items`` in the order work is handed out: by rank; the heavy units longest first (a unit
    ``seconds`` does not name first of all); each unit's items together and in their order."""
    cost: dict[str, float] = defaultdict(float)
    for path, s in seconds.items():
        cost[units.of(f"{path}::")] += s
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(units.of(item.nodeid), index)

    def key(indexed):
        index, item = indexed
        unit, r = units.of(item.nodeid), rank(item)
        longest_first = -cost.get(unit, float("inf")) if r == 3 else 0
        return r, longest_first, first_seen[unit], index

    return [item for _, item in sorted(enumerate(items), key=key)]


def notebooks_run(config) -> set[str]:
    """The notebooks whose cells this process has run so far (a worker: its own only)."""
    return config.stash.setdefault(NOTEBOOKS_RUN, set())


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if is_heavy_folder(item.nodeid.split("::", 1)[0]):
            item.add_marker("heavy")
    seconds = measured_seconds(SECONDS.read_text()) if SECONDS.is_file() else {}
    items[:] = handed_out(items, UnitsOfWork(config.rootpath), seconds)


def pytest_runtest_call(item):
    path = item.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        notebooks_run(item.config).add(path)


# A hook of pytest-xdist's: unknown when it is not loaded.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return min(MAX_WORKERS, os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    # pytest-xdist's own --dist loadgroup renames the items, and nbval then restarts the kernel
    # before every cell; a scheduler that only groups them leaves the items as they are. Its
    # --dist loadfile is built the same way: LoadScopeScheduling with its own _split_scope.
    from xdist.scheduler import LoadScopeScheduling

    units = UnitsOfWork(config.rootpath)

    class ByUnitOfWork(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return units.of(nodeid)

    return ByUnitOfWork(config, log)
