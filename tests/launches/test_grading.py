"""make grade (tools/grade.py), as an instructor runs it: a solved lab scores full marks, a half-done
one scores in between, and each student gets an HTML page of feedback.

Lab 02 runs in the kernel alone (threads): the cheapest lab to run solved, and three check cells
to score a half-done version on. Lab 07b's check launches torchrun from the submission's folder,
on a script a ``%%writefile work/...`` cell wrote there. An untouched lab's zero is tested with
every lab in tests/course/test_labs.py.
"""

import re
import sys
from pathlib import Path

import nbformat
import pytest

from nbgrader_course import CHECK_POINTS, answer_cells, check_cells, grades, notebook_path
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
STEPS = "lab02_manual_data_parallel"
LAUNCHES = "lab07_tensor_parallel_linear"
STUB = re.compile(r"(?m)^( *)# YOUR CODE HERE\n *raise NotImplementedError\(\)$")
# Lab 02's second function, as a student may write it: every chunk's loss weighed alike (wrong for
# the uneven chunks the check feeds it).
PLAIN_MEAN = r"\1return sum(losses) / len(losses)"


def solved(lab: str) -> nbformat.NotebookNode:
    """The lab as a student hands it in finished: each answer cell as its solution has it."""
    nb = nbformat.read(ROOT / "labs" / f"{lab}.ipynb", as_version=4)
    solution = {c.id: c.source for c in nbformat.read(ROOT / "solutions" / f"{lab}.ipynb", as_version=4).cells}
    for cell in answer_cells(nb):
        cell.source = solution[cell.id]
    return nb


def half_done() -> nbformat.NotebookNode:
    """Lab 02 with its first answer solved, its second wrong, its third not started."""
    nb = nbformat.read(ROOT / "labs" / f"{STEPS}.ipynb", as_version=4)
    first, second, _ = answer_cells(nb)
    first.source = answer_cells(solved(STEPS))[0].source
    second.source, replaced = STUB.subn(PLAIN_MEAN, second.source)
    assert replaced == 1, second.source
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """tools/grade.py run on three submissions: lab 02 and lab 07b solved, in nbgrader's layout
    (<student>/<lab>/<lab>.ipynb), and a half-done lab 02 as a student keeps it (<student>/<lab>.ipynb)."""
    submissions, course = tmp_path_factory.mktemp("submissions"), tmp_path_factory.mktemp("course")
    for lab in (STEPS, LAUNCHES):
        (submissions / "ada" / lab).mkdir(parents=True)
        nbformat.write(solved(lab), submissions / "ada" / lab / f"{lab}.ipynb")
    (submissions / "bob").mkdir()
    nbformat.write(half_done(), submissions / "bob" / f"{STEPS}.ipynb")
    command = [sys.executable, "tools/grade.py", "--course", str(course), "--submissions", str(submissions)]
    result = run_bounded([*command, "--labs", STEPS, LAUNCHES], timeout=420, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return course, result.stdout


def checks_run(course: Path, student: str, lab: str) -> list[tuple[str, str | None]]:
    """(grade id, the name of the error it raised or None) of each check cell, as autograde ran it."""
    nb = nbformat.read(notebook_path(course / "autograded", student, lab), as_version=4)
    errors = [next((o.ename for o in c.outputs if o.output_type == "error"), None) for c in check_cells(nb)]
    return [(c.metadata.nbgrader.grade_id, e) for c, e in zip(check_cells(nb), errors)]


def test_a_solved_lab_scores_full_marks(graded):
    course, _ = graded
    scores = grades(course)
    for lab in (STEPS, LAUNCHES):
        assert scores["ada", lab], f"{lab}: no graded cell"
        assert set(scores["ada", lab].values()) == {(CHECK_POINTS, CHECK_POINTS)}, checks_run(course, "ada", lab)


def test_a_half_done_lab_scores_the_checks_it_passes(graded):
    """A check that passes scores its points; one that raises scores 0: CheckFailed (a wrong
    answer), or whatever an answer not started leaves the check to find."""
    course, _ = graded
    ran = checks_run(course, "bob", STEPS)
    errors = [error for _, error in ran]
    assert errors[:2] == [None, "CheckFailed"] and errors[2] is not None, ran
    scores = grades(course)["bob", STEPS]
    assert [scores[grade_id][0] for grade_id, _ in ran] == [CHECK_POINTS, 0, 0]


def test_the_table_and_the_feedback_give_each_score(graded):
    course, printed = graded
    scores = grades(course)
    assert set(scores) == {("ada", STEPS), ("ada", LAUNCHES), ("bob", STEPS)}
    for (student, lab), cells in scores.items():
        got, most = sum(s for s, _ in cells.values()), sum(m for _, m in cells.values())
        assert re.search(rf"(?m)^{student} +{lab} +{got:g} / {most:g}$", printed), printed
        page = (course / "feedback" / student / lab / f"{lab}.html").read_text()
        assert f"Score: {got:.1f} / {most:.1f}" in page, f"{student}/{lab}: its score is not in its feedback"
