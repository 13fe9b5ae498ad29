"""What the course's scripts say about themselves, read from their files, for the tests that launch
them: the command lines a script's docstring gives (``torchrun ... name.py ARGS``, ``python
name.py ARGS``), whether it joins a process group, whether it starts its own workers (mp.spawn), the
options its parser requires. The launch tests take their cases from here: a new script, or a new
chapter's, needs no entry in a test's table.
"""

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
# What ends a command line in a docstring: a comment, or the prose around it.
PROSE = re.compile(r"^[#(]")


@dataclass(frozen=True)
class Usage:
    """One command line of a script's docstring: its arguments, and how it is launched."""

    argv: tuple[str, ...]
    launcher: str
    restartable: bool


def course_scripts(folder: Path | None = None) -> dict[str, Path]:
    """scripts/*.py, and with ``folder`` the scripts the lab solutions write (into folder, beside
    each other and beside the setup module they import, as a lab's work/ folder holds them)."""
    found = {path.name: path for path in sorted(SCRIPTS.glob("*.py"))}
    if folder is not None:
        (folder / "dist_setup.py").write_text((SCRIPTS / "dist_setup.py").read_text())
        for notebook in sorted((ROOT / "solutions").glob("*.ipynb")):
            for name, versions in written_scripts(notebook).items():
                (folder / name).write_text(versions[-1])
                found[name] = folder / name
    return found


def _main_block(tree: ast.Module) -> ast.If | None:
    return next((n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)), None)


def _called(tree: ast.AST) -> set[str]:
    return {ast.unparse(n.func).split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.Call)}


def joins_a_group(text: str) -> bool:
    """Whether running the script joins a process group: it has a __main__ block, and it joins
    (setup() from dist_setup.py, or init_process_group) or starts workers that do (mp.spawn)."""
    tree = ast.parse(text)
    return _main_block(tree) is not None and bool(_called(tree) & {"setup", "init_process_group", "spawn"})


def spawns(text: str) -> bool:
    """Whether the script starts its own workers with mp.spawn (its ranks are its own, not a launcher's)."""
    main = _main_block(ast.parse(text))
    return main is not None and "spawn" in _called(main)


def usages(name: str, text: str) -> list[Usage]:
    """The command lines of the script's docstring that run it, in order: backslash-continued lines
    joined, optional parts ([--out DIR]) left out, the prose after a command dropped."""
    doc = ast.get_docstring(ast.parse(text)) or ""
    lines = re.sub(r"\\\n\s*", " ", doc).splitlines()
    found = []
    for line in lines:
        match = re.search(rf"\b(torchrun|python)\b(.*?)(?:\S*/)?{re.escape(name)}(?=\s|$)(.*)$", line)
        if not match:
            continue
        words = []
        for word in shlex.split(re.sub(r"\[[^\]]*\]", "", match.group(3))):
            if PROSE.match(word):
                break
            words.append(word.rstrip(".") if word.endswith(".") and "/" in word else word)
        found.append(Usage(tuple(words), match.group(1), "--max-restarts" in match.group(2)))
    return found


def required_options(text: str) -> tuple[str, ...]:
    """The options the script's parser requires, each with a value (a path will do for every one
    the course's scripts require)."""
    argv = []
    for call in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)):
        if ast.unparse(call.func).endswith("add_argument") and any(
            k.arg == "required" and ast.unparse(k.value) == "True" for k in call.keywords
        ):
            argv += [call.args[0].value, "OUT"]
    return tuple(argv)


def commands(name: str, text: str) -> list[Usage]:
    """How to run the script: its docstring's command lines, or, where it gives none, the
    arguments its parser requires, under torchrun."""
    return usages(name, text) or [Usage(required_options(text), "torchrun", False)]


def first_torchrun(name: str, text: str) -> tuple[str, ...]:
    """The arguments of the first command line that launches the script with torchrun (else the first)."""
    found = commands(name, text)
    return next((u.argv for u in found if u.launcher == "torchrun" and not u.restartable), found[0].argv)
