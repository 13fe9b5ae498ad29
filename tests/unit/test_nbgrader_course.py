"""nbgrader's cell metadata derived from a solution notebook by rule (tools/nbgrader_course.py), and
where tools/grade.py finds submissions. nbgrader's own runs are tested in tests/course/test_labs.py
and tests/launches/test_grading.py."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grade import submissions_in, table
from nbgrader_course import (
    CHECK_POINTS,
    MARKDOWN_POINTS,
    GradingError,
    answer_cells,
    check_cells,
    nbgrader_metadata,
    source_notebook,
)


def solution(*cells):
    return new_notebook(cells=list(cells), metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})


ANSWER = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION"
CHECK = "# check it: f adds one\nassert f(1) == 2"


def test_a_cell_with_a_solution_region_is_an_answer_the_student_edits():
    meta = nbgrader_metadata(new_code_cell(ANSWER, id="a1"), 3)
    assert meta["solution"] and not meta["grade"] and not meta["locked"]
    assert meta["grade_id"] == "answer-a1"


def test_a_written_answer_is_graded_by_hand():
    meta = nbgrader_metadata(new_markdown_cell("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", id="w"), 0)
    assert meta["solution"] and meta["grade"] and meta["points"] == MARKDOWN_POINTS


def test_a_check_cell_is_a_locked_test_worth_its_points():
    meta = nbgrader_metadata(new_code_cell(CHECK, id="k"), 0)
    assert meta["grade"] and meta["locked"] and not meta["solution"]
    assert meta["points"] == CHECK_POINTS and meta["grade_id"] == "check-k"


@pytest.mark.parametrize(
    "cell",
    [
        new_code_cell("x = 1\n# check it: not on the first line", id="c"),
        new_markdown_cell("# check it", id="m"),
        new_code_cell("%%writefile work/check.py\nprint(1)", id="w"),
    ],
    ids=["check-not-first", "markdown-heading", "writefile"],
)
def test_every_other_cell_is_read_only(cell):
    meta = nbgrader_metadata(cell, 0)
    assert meta["locked"] and not meta["grade"] and not meta["solution"]


def test_a_cell_cannot_be_answer_and_check():
    with pytest.raises(GradingError, match="both"):
        nbgrader_metadata(new_code_cell(CHECK + "\n" + ANSWER), 0)


def test_grade_id_without_a_cell_id_is_the_position():
    cell = new_code_cell(CHECK)
    del cell["id"]
    assert nbgrader_metadata(cell, 7)["grade_id"] == "check-7"


def test_source_notebook_marks_every_cell_and_leaves_the_solution_unchanged():
    answer = new_code_cell(ANSWER, id="a")
    answer.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    original = solution(new_markdown_cell("# Lab", id="t"), answer, new_code_cell(CHECK, id="k"))
    original.metadata["widgets"] = {"state": {}}
    source = source_notebook(original)
    assert [c.metadata.nbgrader.grade_id for c in source.cells] == ["readonly-t", "answer-a", "check-k"]
    assert answer_cells(source) == [source.cells[1]] and check_cells(source) == [source.cells[2]]
    assert "execution" not in source.cells[1].metadata and "widgets" not in source.metadata
    assert "nbgrader" not in original.cells[1].metadata and "execution" in original.cells[1].metadata


def test_nbgrader_accepts_the_metadata():
    from nbgrader.nbgraderformat import MetadataValidator

    source = source_notebook(
        solution(
            new_markdown_cell("# Lab", id="t"),
            new_code_cell(ANSWER, id="a"),
            new_code_cell(CHECK, id="k"),
            new_markdown_cell("### BEGIN SOLUTION\nBecause.\n### END SOLUTION", id="w"),
        )
    )
    MetadataValidator().validate_nb(source)


def test_a_notebook_without_solution_regions_is_refused():
    with pytest.raises(GradingError, match="no '### BEGIN SOLUTION' region"):
        source_notebook(solution(new_code_cell("x = 1")))


def test_submissions_in_nbgraders_layout_and_as_students_keep_them(tmp_path):
    nb = nbformat.writes(solution(new_code_cell(ANSWER)))
    (tmp_path / "ada" / "lab02").mkdir(parents=True)
    (tmp_path / "ada" / "lab02" / "lab02.ipynb").write_text(nb)
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "lab02.ipynb").write_text(nb)
    (tmp_path / "bob" / "notes.ipynb").write_text(nb)
    found = submissions_in(tmp_path, ["lab02", "lab03"])
    assert found == {
        ("ada", "lab02"): tmp_path / "ada" / "lab02" / "lab02.ipynb",
        ("bob", "lab02"): tmp_path / "bob" / "lab02.ipynb",
    }


def test_the_table_sums_each_submissions_cells():
    lines = table({("ada", "lab02"): {"check-a": (1.0, 1.0), "check-b": (0.0, 1.0)}}).splitlines()
    assert lines[1].split() == ["ada", "lab02", "1", "/", "2"]
