"""The labs as an nbgrader course: nbgrader's cell metadata from the solutions, and nbgrader's steps.

A solution notebook carries no nbgrader metadata: it is derived here, by rule, for every cell.

- An **answer** cell holds a ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region: nbgrader's
  "solution" cell, which its generate step turns into ``# YOUR CODE HERE`` +
  ``raise NotImplementedError()`` (in markdown, ``YOUR ANSWER HERE``; a written answer is graded by
  hand, ``MARKDOWN_POINTS``).
- A **check** cell is a code cell whose first line starts with ``# check it``: an autograder test
  worth ``CHECK_POINTS``; it scores them when it runs without an error, 0 when it raises
  (``CheckFailed``, ``LaunchFailed``, the student's ``NotImplementedError``, ...).
- Every other cell is read-only, as are the check cells: a student edits only the answers.

A cell's ``grade_id`` comes from its cell id, so it stays the same when cells are added around it.

The course folder follows nbgrader's layout: ``source/<lab>/<lab>.ipynb`` (a solution with the
metadata), ``release/`` (the student versions: ``labs/``), ``submitted/<student>/<lab>/``,
``autograded/``, ``feedback/`` and ``gradebook.db``. Each lab is an assignment of its own.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
CONFIG = Path(__file__).with_name("nbgrader_config.py")
BEGIN = "### BEGIN SOLUTION"
CHECK = "# check it"
CHECK_POINTS = 1
MARKDOWN_POINTS = 1
# What one course folder holds that a run of this module makes (and so may remove).
MADE = ("source", "release", "submitted", "autograded", "feedback", "gradebook.db", "nbgrader.log")


class GradingError(RuntimeError):
    """A notebook the rule cannot mark, or an nbgrader step that failed."""


def role(cell) -> str:
    """'answer', 'check' or 'readonly': see the module's docstring."""
    answer = BEGIN in cell.source
    check = cell.cell_type == "code" and cell.source.startswith(CHECK)
    if answer and check:
        raise GradingError(f"a cell is both an answer and a check:\n{cell.source}")
    return "answer" if answer else "check" if check else "readonly"


def nbgrader_metadata(cell, index: int) -> dict:
    """The ``nbgrader`` metadata of the solution's cell at ``index``, by the rule."""
    kind = role(cell)
    meta = {
        "grade": kind == "check" or (kind == "answer" and cell.cell_type == "markdown"),
        "grade_id": f"{kind}-{cell.get('id') or index}",
        "locked": kind != "answer",
        "schema_version": 3,
        "solution": kind == "answer",
        "task": False,
    }
    if meta["grade"]:
        meta["points"] = CHECK_POINTS if kind == "check" else MARKDOWN_POINTS
    return meta


def source_notebook(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """nbgrader's source version of a solution notebook: its cells with nbgrader's metadata, without
    the traces of executing it (a new notebook; the input is unchanged)."""
    source = copy.deepcopy(solution)
    for index, cell in enumerate(source.cells):
        cell.metadata["nbgrader"] = nbgrader_metadata(cell, index)
        cell.metadata.pop("execution", None)
    if not answer_cells(source):
        raise GradingError(f"no {BEGIN!r} region: is this a solution notebook?")
    source.metadata.pop("widgets", None)
    return source


def answer_cells(nb) -> list:
    """The cells a student completes (nbgrader's solution cells)."""
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]


def check_cells(nb) -> list:
    """The autograder tests: graded code cells that are not answers."""
    return [
        c
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade") and not c.metadata.nbgrader.solution
    ]


def notebook_path(folder: Path, student: str | None, lab: str) -> Path:
    """Where nbgrader keeps ``lab`` in ``folder`` (source and release have no student level)."""
    return folder / (student or "") / lab / f"{lab}.ipynb"


def write_course(course: Path, solutions: list[Path]) -> None:
    """A fresh course folder: the configuration and the source version of each solution. What an
    earlier run made there (``MADE``) is removed first, nothing else."""
    course.mkdir(parents=True, exist_ok=True)
    for name in MADE:
        path = course / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    shutil.copyfile(CONFIG, course / "nbgrader_config.py")
    for solution in solutions:
        path = notebook_path(course / "source", None, solution.stem)
        path.parent.mkdir(parents=True)
        nbformat.write(source_notebook(nbformat.read(solution, as_version=4)), path)


def nbgrader(course: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``nbgrader ARGS`` in the course folder, bounded (with every process it starts: kernels, the
    launches of check cells); its log is added to ``nbgrader.log`` there."""
    # nbgrader runs `alembic` (a console script beside this Python) to set up its database.
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    command = [sys.executable, "-m", "nbgrader", *args]
    try:
        result = run_bounded(command, timeout=timeout, cwd=course, env=env)
    except subprocess.TimeoutExpired as expired:
        log = f"{expired.stdout or ''}{expired.stderr or ''}"
        _log(course, args, log)
        raise GradingError(f"nbgrader {' '.join(args)} ran past {timeout:g} s:\n{_tail(log)}") from None
    _log(course, args, result.stdout + result.stderr)
    if result.returncode != 0:
        raise GradingError(f"nbgrader {' '.join(args)} failed:\n{_tail(result.stdout + result.stderr)}")
    return result


def _log(course: Path, args, text: str) -> None:
    with open(course / "nbgrader.log", "a") as log:
        log.write(f"$ nbgrader {' '.join(args)}\n{text}\n")


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def generate(course: Path, timeout: float = 300) -> dict[str, Path]:
    """nbgrader's generate step for every lab in ``source/``: lab name -> its student version in
    ``release/``; the gradebook records each lab's cells (what autograde restores and scores)."""
    nbgrader(course, "generate_assignment", "*", "--force", timeout=timeout)
    labs = sorted(p.name for p in (course / "source").iterdir())
    return {lab: notebook_path(course / "release", None, lab) for lab in labs}


def submit(course: Path, student: str, lab: str, notebook: Path) -> Path:
    """``notebook`` as ``student``'s submission of ``lab`` (a copy, where nbgrader collects it)."""
    path = notebook_path(course / "submitted", student, lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(notebook, path)
    return path


def autograde(course: Path, timeout: float) -> None:
    """Run every submission (each in its own folder in ``autograded/``) and score its check cells."""
    nbgrader(course, "autograde", "*", "--force", timeout=timeout)


def generate_feedback(course: Path, timeout: float = 300) -> None:
    """One HTML page per autograded notebook in ``feedback/<student>/<lab>/``."""
    nbgrader(course, "generate_feedback", "*", "--force", timeout=timeout)


def grades(course: Path) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """(student, lab) -> {grade_id: (score, max_score)} of every graded cell, from the gradebook."""
    from nbgrader.api import Gradebook

    found = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                cells = {
                    grade.cell.name: (grade.score, grade.max_score)
                    for notebook in submission.notebooks
                    for grade in notebook.grades
                }
                found[submission.student.id, assignment.name] = cells
    return found
