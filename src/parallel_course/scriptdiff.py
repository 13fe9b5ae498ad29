"""Scripts that grow step by step: what a notebook's ``%%writefile`` cells write, and what one
version changed from the one before (chapters 04 and 09 show every step of ``train_ddp.py`` so).

A script is written by a ``%%writefile work/<name>`` cell followed by any number of
``%%writefile -a work/<name>`` cells (no cell longer than a screen); together they make one
version. ``tools/export_scripts.py`` exports the last version of each script to ``scripts/``.
"""

import difflib
import re
from pathlib import Path

import nbformat

# [ \t]*, not \s*: the blank lines that open an appended part belong to the script.
WRITEFILE = re.compile(r"^%%writefile[ \t]+(-a[ \t]+)?(\S+)[ \t]*\n")


def written_scripts(notebook: str | Path) -> dict[str, list[str]]:
    """File name -> every version of it the notebook writes, in order, byte for byte as IPython
    writes it (each cell's body and a newline; a write and the appends after it are one version)."""
    versions: dict[str, list[str]] = {}
    for cell in nbformat.read(notebook, as_version=4).cells:
        m = WRITEFILE.match(cell.source) if cell.cell_type == "code" else None
        if not m:
            continue
        append, name = m.group(1), Path(m.group(2)).name
        body = cell.source[m.end() :].rstrip("\n") + "\n"
        if not append:
            versions.setdefault(name, []).append(body)
        elif name in versions:
            versions[name][-1] += body
        else:
            raise ValueError(f"{Path(notebook).name}: %%writefile -a {m.group(2)} before any %%writefile of it")
    return versions


def version(notebook: str | Path, name: str, index: int = -1) -> str:
    """One version of script ``name`` as ``notebook`` writes it: the last by default, 0 for the first."""
    found = written_scripts(notebook).get(name)
    if not found:
        raise ValueError(f"{Path(notebook).name} writes no {name}")
    return found[index]


def code_of(line: str) -> str:
    """A line without its trailing comment (a changed comment alone is no change)."""
    return line.split("  # ")[0].rstrip()


def changed_lines(before: str, after: str) -> list[str]:
    """The lines of ``after`` whose code is new or changed since ``before``: no blank lines, no
    docstring or comment lines, no line whose only change is its comment."""

    def body(text):  # from the first import on: the module docstring says which step it is
        lines = text.splitlines()
        return lines[next((i for i, line in enumerate(lines) if line.startswith(("import ", "from "))), 0) :]

    diff = list(difflib.unified_diff(body(before), body(after), n=0, lineterm=""))
    removed = {code_of(line[1:]) for line in diff if line.startswith("-") and not line.startswith("---")}
    return [
        line[1:]
        for line in diff
        if line.startswith("+")
        and not line.startswith("+++")
        and code_of(line[1:]).strip()
        and not line[1:].strip().startswith(('"""', "#"))
        and code_of(line[1:]) not in removed
    ]


def _text(source: str | Path) -> str:
    """A script's text: ``source`` itself if it has several lines, else the file it names."""
    return source if isinstance(source, str) and "\n" in source else Path(source).read_text()


def show_changes(before: str | Path, after: str | Path) -> None:
    """Print the lines of code that ``after`` changed or added since ``before`` (each a path or a
    script's text), then how many. Returns nothing, so that a cell shows only what it prints."""
    lines = changed_lines(_text(before), _text(after))
    print("\n".join(lines))
    print(f"\n{len(lines)} line{'' if len(lines) == 1 else 's'} of code changed or added")
