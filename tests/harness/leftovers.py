"""A notebook passes on top of an earlier run's leftovers, in one run: the stale files are planted.

A notebook writes into ``work/`` beside it, and some of it is state that the next run could read
back: a checkpoint a launch resumes from, a file every run appends to, a log a cell waits on. On
a student's machine the second run finds the first one's files; a fresh clone never does. So,
before the suite's one run of a notebook, what a run of it leaves in ``work/`` (its record,
``tests/leftovers/<folder>/<notebook>.txt``) is put there, stale: every recorded file, and one
"from a longer run" (each number in its path after the first folder turned into nines, such as a
checkpoint ``step-999999``), holding a line that no reader accepts. A notebook that clears its
state before its launches write it passes; one that resumes from, appends to or reads what it
finds there fails its cells (a checkpoint that cannot be read, a line that differs). After the
run, the leftovers are checked:

- a planted file the run appended to fails the notebook (it kept an earlier run's content);
- the record must still be what the run leaves: a file it left that the record lacks, under a
  name of ``work/`` that the notebook owns (one its record or its code names), or a recorded file
  it did not leave, fails the notebook until the record is made again;
- planted files the run neither cleared nor rewrote are removed, so ``work/`` is as a run leaves it.

Records hold data only: the scripts in ``work/`` are rewritten by every run (``%%writefile``, the
setup cell), and a notebook that runs a script it did not write fails
tests/course/test_notebook_conventions.py. The names a notebook owns in ``work/`` are its alone
outside its unit of work (tests/harness/test_leftovers.py checks it), so the two workers never
plant into, or count, each other's files.

``pytest --record-leftovers -p no:xdist NOTEBOOK...`` runs the notebooks and writes their records
(one process: a record is everything the notebook changed in ``work/`` while it ran).
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

RECORDS = Path("tests") / "leftovers"
# What a planted file holds: no checkpoint, JSON or number reader accepts it, and a line printed
# from it differs from the stored output.
STALE = b"stale: an earlier run of this notebook left this file in work/ (tests/harness/leftovers.py)\n"
# Not state: scripts are rewritten by every run, byte code by Python.
NOT_STATE = re.compile(r"(^|/)__pycache__(/|$)|\.py$")
# A literal path into work/ in a notebook's code; a name that an f-string goes on to build is
# not a name the notebook owns alone (chapters share prefixes such as gpt_).
NAMED = re.compile(r"""work/([A-Za-z0-9_.\-]+)(?![A-Za-z0-9_.\-]*\{)""")
DIGITS = re.compile(r"\d+")
RUNS = pytest.StashKey[dict]()
DESELECTED = pytest.StashKey[set]()
# Records made in this run, written when it ends: after the aftermath's look at the working tree
# (tests/harness/nothing_left_behind.py), which would otherwise count them as the suite's litter.
MADE = pytest.StashKey[dict]()


def record_path(root: Path, notebook: str) -> Path:
    """Where the record of ``notebook`` (a path relative to ``root``) lives."""
    return root / RECORDS / Path(notebook).with_suffix(".txt")


def read_record(path: Path) -> list[str] | None:
    """The files a record lists (relative to the notebook's work/), or None without a record."""
    if not path.is_file():
        return None
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def write_record(path: Path, notebook: str, files: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# What a run of {notebook} leaves in its work/ folder: planted there, stale, before the\n"
        "# suite runs it (tests/harness/leftovers.py). Made by: pytest --record-leftovers -p no:xdist "
        f"{notebook}\n"
    )
    path.write_text(header + "".join(f"{name}\n" for name in sorted(files)))


def longer_run(name: str) -> str | None:
    """The file a longer earlier run would have left instead of ``name``: each number in the path
    after its first folder all nines (``ckpt/step-000004/x`` -> ``ckpt/step-999999/x``); None
    when the path holds no such number."""
    first, sep, rest = name.partition("/")
    if not sep or not DIGITS.search(rest):
        return None
    return first + sep + DIGITS.sub(lambda m: "9" * len(m.group()), rest)


def named_in_work(notebook: Path) -> set[str]:
    """The entries of work/ that the notebook's own code names (not its scripts' text): the first
    part of each literal path into work/."""
    names = set()
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "code" or cell.source.startswith("%%writefile"):
            continue
        names |= {match.split("/")[0] for match in NAMED.findall(cell.source)}
    return {name for name in names if name not in (".", "..") and not NOT_STATE.search(name)}


def owned_names(notebook: Path, record: list[str]) -> set[str]:
    """The entries of work/ that are the notebook's: those its record or its code names."""
    return named_in_work(notebook) | {name.split("/")[0] for name in record}


def snapshot(work: Path) -> dict[str, tuple[int, int, int]]:
    """Every data file under ``work`` (relative path -> inode, size, modification time)."""
    if not work.is_dir():
        return {}
    files = {}
    for path in work.rglob("*"):
        name = path.relative_to(work).as_posix()
        if NOT_STATE.search(name):
            continue
        try:
            if path.is_file() and not path.is_symlink():
                stat = path.stat()
                files[name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except OSError:
            # Removed while we looked: a launch of the other worker's notebook clearing its own.
            continue
    return files


def changed(before: dict, after: dict) -> set[str]:
    """The files that are new, or rewritten, in ``after``."""
    return {name for name, stat in after.items() if before.get(name) != stat}


def plant(work: Path, record: list[str]) -> dict[str, tuple[int, int, int]]:
    """Put each recorded file, and its longer run's, in ``work`` with stale content, where there is
    nothing yet (an earlier run's real files are better leftovers than ours). Returns what was
    planted, as ``snapshot`` sees it."""
    planted = {}
    for name in sorted({*record, *filter(None, map(longer_run, record))}):
        path = work / name
        if path.exists() or any(parent.is_file() for parent in path.parents if parent != work):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(STALE)
        stat = path.stat()
        planted[name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return planted


def problems_after(work: Path, record: list[str], planted: dict, before: dict, owned: set[str]) -> list[str]:
    """What is wrong with the leftovers of the run that started at ``before`` (see the module's
    docstring); removes the planted files the run did not touch."""
    after = snapshot(work)
    new = changed(before, after)
    problems = []
    for name, stat in sorted(planted.items()):
        if name not in after:
            continue
        if after[name] == stat:
            (work / name).unlink()
            after.pop(name)
        elif (work / name).read_bytes().startswith(STALE):
            problems.append(f"work/{name}: the run added to an earlier run's file instead of starting it afresh")
    longer = set(filter(None, map(longer_run, record))) - set(record)
    unrecorded = sorted(name for name in new - set(record) - longer if name.split("/")[0] in owned)
    missing = sorted(set(record) - new)
    if unrecorded or missing:
        problems.append(
            "the record of what this notebook leaves in work/ is out of date"
            + "".join(f"\n  left, not recorded: {name}" for name in unrecorded)
            + "".join(f"\n  recorded, not left: {name}" for name in missing)
        )
    return problems


@dataclass
class NotebookRun:
    """One notebook's run in this process."""

    work: Path
    record: list[str] | None
    before: dict = field(default_factory=dict)
    planted: dict = field(default_factory=dict)


def pytest_addoption(parser):
    parser.addoption(
        "--record-leftovers",
        action="store_true",
        help="write each notebook's record of what it leaves in work/ (tests/harness/leftovers.py); "
        "one process only (-p no:xdist)",
    )


def pytest_configure(config):
    if config.getoption("record_leftovers", False) and (
        hasattr(config, "workerinput") or config.getoption("numprocesses", None)
    ):
        raise pytest.UsageError("--record-leftovers runs in one process: add -p no:xdist")
    config.stash[RUNS] = {}
    config.stash[DESELECTED] = set()
    config.stash[MADE] = {}


def pytest_unconfigure(config):
    for notebook, files in config.stash.get(MADE, {}).items():
        write_record(record_path(config.rootpath, notebook), notebook, files)


def pytest_deselected(items):
    # A notebook run in part (-k) leaves part of what it leaves: neither planted nor checked.
    for item in items:
        if is_cell(item):
            item.config.stash[DESELECTED].add(notebook_of(item))


def is_cell(item) -> bool:
    return item.nodeid.split("::", 1)[0].endswith(".ipynb") and "::Cell " in item.nodeid


def notebook_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # tryfirst: before nbval starts the notebook's kernel (the setup of the file the cell is in).
    if not is_cell(item):
        return
    notebook, runs = notebook_of(item), item.config.stash[RUNS]
    if notebook in runs or notebook in item.config.stash[DESELECTED]:
        return
    root = item.config.rootpath
    work = (root / notebook).parent / "work"
    recording = item.config.getoption("record_leftovers")
    run = runs[notebook] = NotebookRun(work, None if recording else read_record(record_path(root, notebook)))
    if run.record is not None:
        run.planted = plant(work, run.record)
    run.before = snapshot(work)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if not is_cell(item) or (nextitem is not None and is_cell(nextitem) and notebook_of(nextitem) == notebook_of(item)):
        return
    run = item.config.stash[RUNS].get(notebook_of(item))
    if run is None or notebook_of(item) in item.config.stash[DESELECTED]:
        return
    root, notebook = item.config.rootpath, notebook_of(item)
    if item.config.getoption("record_leftovers"):
        item.config.stash[MADE][notebook] = sorted(changed(run.before, snapshot(run.work)))
        return
    if run.record is None:
        return
    owned = owned_names(root / notebook, run.record)
    problems = problems_after(run.work, run.record, run.planted, run.before, owned)
    if problems:
        raise AssertionError(
            f"{notebook} on top of an earlier run's leftovers (tests/harness/leftovers.py):\n"
            + "\n".join(problems)
            + f"\nIf the notebook now leaves other files, record them: pytest --record-leftovers -p no:xdist {notebook}"
        )
