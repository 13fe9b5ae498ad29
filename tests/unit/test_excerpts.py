"""What a lecture prints of a script it reads (parallel_course.excerpts), and the copy it runs."""

import pytest

from parallel_course.excerpts import SCRIPTS, copy_scripts, excerpt, show

SCRIPT = '''"""A script."""

import os

LIMIT = 3


# why f exists
@staticmethod
def f(x):
    return x + 1


class C:
    def g(self):
        return os.getpid()
'''


def test_an_excerpt_is_one_definition_with_its_decorators_and_the_comment_above(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(SCRIPT)
    assert excerpt(path, "f") == (8, "# why f exists\n@staticmethod\ndef f(x):\n    return x + 1")
    assert excerpt(path, "LIMIT") == (5, "LIMIT = 3")
    assert excerpt(path, "C")[1].endswith("return os.getpid()")
    with pytest.raises(ValueError, match="defines no top-level g"):
        excerpt(path, "g")


def test_show_prints_each_definition_under_its_file_and_nothing_else_changes_it(tmp_path, capsys):
    path = tmp_path / "s.py"
    path.write_text(SCRIPT)
    assert show(path, "LIMIT", "f") is None
    shown = capsys.readouterr().out
    assert shown == "# s.py\nLIMIT = 3\n\n# s.py\n# why f exists\n@staticmethod\ndef f(x):\n    return x + 1\n"
    # An edit elsewhere in the file (lines added above, another function changed) leaves what a
    # notebook stored of f as it was; an edit of f itself shows.
    path.write_text(SCRIPT.replace('"""A script."""', '"""A script,\nnow longer."""\n\nimport sys\n'))
    path.write_text(path.read_text().replace("os.getpid()", "os.getppid()"))
    show(path, "LIMIT", "f")
    assert capsys.readouterr().out == shown
    path.write_text(path.read_text().replace("x + 1", "x + 2"))
    show(path, "f")
    assert capsys.readouterr().out.endswith("return x + 2\n")


def test_a_module_of_the_package_is_named_by_its_path_in_the_package(capsys):
    import parallel_course.training.layouts as layouts

    show(layouts.__file__, "REST")
    assert capsys.readouterr().out.splitlines()[0] == "# parallel_course/training/layouts.py"
    show(SCRIPTS / "train_gpt.py", "main")
    assert capsys.readouterr().out.splitlines()[0] == "# train_gpt.py"


def test_copied_scripts_equal_their_source_and_leave_no_temporary_file(tmp_path):
    copy_scripts("dist_setup.py", into=tmp_path / "work")
    assert (tmp_path / "work" / "dist_setup.py").read_text() == (SCRIPTS / "dist_setup.py").read_text()
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["dist_setup.py"]
