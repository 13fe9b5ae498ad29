"""A lecture reads a long script instead of writing it: the functions that matter, and the
script copied into ``work/`` to run.

    show("../scripts/bench_allreduce.py", "busbw", "time_all_reduce")
    copy_scripts("bench_allreduce.py", "dist_setup.py")

A script has one source: a notebook's ``%%writefile`` cell or, for the tool-sized ones (the
benchmarks, the reference trainers once built), its file in ``scripts/``. Showing a piece of the
file never makes a second copy of it.

A piece is found by its name and printed under the file it comes from, without a line number: what
a notebook stores is then the same as long as the piece itself is, whatever changes elsewhere in
the file (a number would be out of date in the stored output, or make every lecture that shows the
file re-store its outputs after any edit). The reader finds it by the name on its first line.
"""

import ast
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SCRIPTS = PACKAGE.parents[1] / "scripts"


def excerpt(path: str | Path, name: str) -> tuple[int, str]:
    """The first line number and the source of the top-level function, class or assignment
    ``name`` in the file ``path``, its decorators and comments directly above it included."""
    text = Path(path).read_text()
    lines = text.splitlines()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found = node.name == name
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = any(isinstance(t, ast.Name) and t.id == name for t in targets)
        else:
            found = False
        if found:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            # The comment lines right above belong to it: they say why it is there.
            while first > 1 and lines[first - 2].lstrip().startswith("#"):
                first -= 1
            return first, "\n".join(lines[first - 1 : node.end_lineno])
    raise ValueError(f"{Path(path).name} defines no top-level {name}")


def source_name(path: str | Path) -> str:
    """How a shown piece's file is named above it: a module of the course's package by its path in
    the package (parallel_course/training/layouts.py), any other file by its name (train_gpt.py)."""
    path = Path(path).resolve()
    if path.is_relative_to(PACKAGE):
        return str(path.relative_to(PACKAGE.parent))
    return path.name


def show(path: str | Path, *names: str) -> None:
    """Print the named functions (classes, constants) of a script or module, each under the name of
    its file, in the order asked. Returns nothing, so that a cell shows only what it prints."""
    parts = [f"# {source_name(path)}\n{excerpt(path, name)[1]}" for name in names]
    print("\n\n".join(parts))


def copy_scripts(*names: str, into: str | Path = "work") -> None:
    """Copy scripts from ``scripts/`` into ``into`` (a notebook's ``work/``), each replaced in
    one step: a notebook running beside this one never imports half a file."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        fd, tmp = tempfile.mkstemp(dir=into, prefix=f".{name}.")
        os.close(fd)
        shutil.copyfile(SCRIPTS / name, tmp)
        os.replace(tmp, into / name)
