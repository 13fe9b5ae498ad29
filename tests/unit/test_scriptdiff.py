"""parallel_course.scriptdiff: what a notebook's %%writefile cells write, and what a step changed."""

import nbformat
import pytest

from parallel_course.scriptdiff import diff_lines, show_changes, version, written_scripts


def notebook(tmp_path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_write_and_its_appends_are_one_version(tmp_path):
    path = notebook(
        tmp_path,
        "%%writefile work/a.py\nimport os\nx = 1",
        "print('not a script')",
        "%%writefile -a work/a.py\n\n\ndef f():\n    return x",
        "%%writefile work/a.py\nimport sys\n",
        "%%writefile work/b.txt\nb",
    )
    scripts = written_scripts(path)
    assert scripts["a.py"] == ["import os\nx = 1\n\n\ndef f():\n    return x\n", "import sys\n"]
    assert scripts["b.txt"] == ["b\n"]
    assert version(path, "a.py", 0).startswith("import os") and version(path, "a.py") == "import sys\n"
    with pytest.raises(ValueError, match="writes no c.py"):
        version(path, "c.py")


def test_an_append_before_any_write_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="before any %%writefile"):
        written_scripts(notebook(tmp_path, "%%writefile -a work/a.py\nx = 1"))


def test_a_diff_shows_context_and_removed_lines_not_only_added_ones():
    before = "import os\n\nx = 1\ny = 2\nz = 3\n"
    after = "import os\n\nx = 1\ny = 20\nz = 3\nw = 4\n"
    assert diff_lines(before, after, context=1) == [
        "@@ -3,3 +3,4 @@",
        " x = 1",
        "-y = 2",
        "+y = 20",
        " z = 3",
        "+w = 4",
    ]


def test_show_changes_reads_files_or_text_and_counts(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import os\nx = 1\n")
    assert show_changes(tmp_path / "a.py", "import os\nx = 2\n") is None  # a cell shows only the print
    assert capsys.readouterr().out == "@@ -1,2 +1,2 @@\n import os\n-x = 1\n+x = 2\n\n1 line added, 1 removed\n"
