"""Scripts that grow step by step: what a notebook's ``%%writefile`` cells write, and what one
version changed from the one before, as a diff (chapters 04 and 09 show the steps of DDP training so).

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


def _text(source: str | Path) -> str:
    """A script's text: ``source`` itself if it has several lines, else the file it names."""
    return source if isinstance(source, str) and "\n" in source else Path(source).read_text()


def diff_lines(before: str, after: str, context: int = 2) -> list[str]:
    """The unified diff from ``before`` to ``after`` (two scripts' texts): each change with
    ``context`` unchanged lines around it, removed lines (``-``) as well as added ones (``+``)."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=context, lineterm="")
    # The two file-name lines say nothing here: the caller names the versions.
    return [line for line in diff if not line.startswith(("---", "+++"))]


def show_changes(before: str | Path, after: str | Path, context: int = 2) -> None:
    """Print what ``after`` changed since ``before`` (each a path or a script's text) as a
    unified diff, then how many lines were added and removed. Returns nothing, so that a cell
    shows only what it prints."""
    lines = diff_lines(_text(before), _text(after), context)
    added = sum(line.startswith("+") for line in lines)
    removed = sum(line.startswith("-") for line in lines)
    print("\n".join(lines))
    print(f"\n{added} line{'' if added == 1 else 's'} added, {removed} removed")
