"""Generate a lab (student version) from its solution notebook.

Same convention as nbgrader's ``ClearSolutions``: in a code cell, each region between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes ``# YOUR CODE HERE`` followed by
``raise NotImplementedError()`` at the marker's indentation; in a markdown cell it becomes
``YOUR ANSWER HERE``. Outputs and execution counts are cleared.
"""

from __future__ import annotations

import copy
import re

import nbformat

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CODE_STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]
MARKDOWN_STUB = "YOUR ANSWER HERE"

_MARKER = re.compile(r"^(\s*)(### BEGIN SOLUTION|### END SOLUTION)\s*$")


class MarkerError(ValueError):
    """Unbalanced or nested solution markers."""


def clear_solutions(source: str, cell_type: str = "code") -> tuple[str, bool]:
    """Return (student source, whether any region was replaced)."""
    out: list[str] = []
    inside = False
    replaced = False
    for lineno, line in enumerate(source.split("\n"), start=1):
        m = _MARKER.match(line)
        if m and m.group(2) == BEGIN:
            if inside:
                raise MarkerError(f"line {lineno}: nested '{BEGIN}'")
            inside, replaced = True, True
            indent = m.group(1)
            if cell_type == "code":
                out.extend(indent + stub for stub in CODE_STUB)
            else:
                out.append(indent + MARKDOWN_STUB)
        elif m:
            if not inside:
                raise MarkerError(f"line {lineno}: '{END}' without '{BEGIN}'")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"'{BEGIN}' without '{END}'")
    return "\n".join(out), replaced


_STUB = re.compile(r"(?m)^\s*# YOUR CODE HERE\n\s*raise NotImplementedError\(\)\s*$")


def is_solution_cell(cell) -> bool:
    """A cell of a generated lab that the student has to complete (stub at any indentation)."""
    return cell.cell_type == "code" and bool(_STUB.search(cell.source))


def make_lab(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student version of a solution notebook (a new notebook; the input is unchanged)."""
    lab = copy.deepcopy(solution)
    found = False
    for cell in lab.cells:
        cell.source, replaced = clear_solutions(cell.source, cell.cell_type)
        found |= replaced
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    if not found:
        raise MarkerError("no solution regions found: is this a solution notebook?")
    lab.metadata.pop("widgets", None)
    return lab


def lab_text(solution_path) -> str:
    """The exact text of the lab file generated from ``solution_path``."""
    nb = nbformat.read(solution_path, as_version=4)
    return nbformat.writes(make_lab(nb)) + "\n"
