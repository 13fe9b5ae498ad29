import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from labgen import MarkerError, clear_solutions, is_solution_cell, make_lab


def test_code_region_becomes_stub_at_marker_indentation():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\nprint(f(1))"
    out, replaced = clear_solutions(src)
    assert replaced
    assert out == ("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n\nprint(f(1))")


def test_markdown_region_becomes_answer_here():
    out, replaced = clear_solutions("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", "markdown")
    assert replaced and out == "Why?\nYOUR ANSWER HERE"


def test_cell_without_markers_is_unchanged():
    assert clear_solutions("x = 1\n") == ("x = 1\n", False)


@pytest.mark.parametrize(
    "src",
    [
        "### BEGIN SOLUTION\nx = 1",
        "x = 1\n### END SOLUTION",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION",
    ],
)
def test_unbalanced_markers_are_rejected(src):
    with pytest.raises(MarkerError):
        clear_solutions(src)


def test_make_lab_clears_outputs_and_keeps_the_solution_notebook():
    cell = new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")
    cell.outputs = [nbformat.v4.new_output("stream", text="hi")]
    cell.execution_count = 3
    solution = new_notebook(cells=[new_markdown_cell("# Lab"), cell])
    lab = make_lab(solution)
    assert lab.cells[1].outputs == [] and lab.cells[1].execution_count is None
    assert is_solution_cell(lab.cells[1]) and not is_solution_cell(lab.cells[0])
    assert "x = 1" in solution.cells[1].source  # input untouched


def test_make_lab_rejects_a_notebook_without_solutions():
    with pytest.raises(MarkerError, match="no solution regions"):
        make_lab(new_notebook(cells=[new_code_cell("x = 1")]))


def test_indented_stub_is_a_solution_cell():
    out, _ = clear_solutions("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION")
    assert is_solution_cell(new_code_cell(out))
