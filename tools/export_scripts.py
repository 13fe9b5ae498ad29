"""Export scripts/<name>.py from the last `%%writefile work/<name>.py` cell of the course.

A script a lecture writes may come in parts, with prose between them: one
`%%writefile work/<name>.py` cell, then `%%writefile -a work/<name>.py` cells that append to it.
The export is what the last write and the appends after it leave in work/, byte for byte as
IPython writes it. Scripts no notebook writes (the benchmarks, the reference trainers) are
ordinary files in scripts/, their only source.

    python tools/export_scripts.py           # write scripts/
    python tools/export_scripts.py --check   # exit 1 if scripts/ differs from the notebooks
    python tools/export_scripts.py --format  # ruff format every %%writefile cell in place, then export

Lecture notebooks are read in chapter order, so a script that grows over several chapters is
exported in its final form.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import nbformat

from parallel_course.scriptdiff import WRITEFILE, written_scripts

ROOT = Path(__file__).resolve().parent.parent


def last_writefiles(notebooks: list[Path]) -> dict[str, str]:
    """File name -> its last version, over the notebooks in order (parallel_course.scriptdiff)."""
    scripts: dict[str, str] = {}
    for path in notebooks:
        scripts.update({name: versions[-1] for name, versions in written_scripts(path).items()})
    return scripts


def ruff_format(code: str) -> str:
    """``code`` as ``ruff format`` lays it out (the repository's settings)."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", "scripts/part.py", "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return result.stdout


def format_cells(notebook: Path) -> bool:
    """Format the body of each `%%writefile` cell of ``notebook`` in place; True if any changed.
    An appended part keeps the blank lines that open it (they separate it from the part before):
    two before a definition, as ruff lays out the whole file."""
    nb = nbformat.read(notebook, as_version=4)
    changed = False
    for cell in nb.cells:
        m = WRITEFILE.match(cell.source) if cell.cell_type == "code" else None
        if not m:
            continue
        body = cell.source[m.end() :]
        opening = body[: len(body) - len(body.lstrip("\n"))]
        if opening and body.lstrip("\n").startswith(("def ", "async def ", "class ", "@")):
            # ruff's two blank lines before a top-level definition, across the cell boundary too
            opening = "\n\n"
        source = cell.source[: m.end()] + opening + ruff_format(body).rstrip("\n")
        if source != cell.source:
            cell.source, changed = source, True
    if changed:
        nbformat.write(nb, notebook)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift, write nothing")
    parser.add_argument("--format", action="store_true", help="ruff format the %%writefile cells first")
    args = parser.parse_args()
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.format:
        for path in notebooks:
            if format_cells(path):
                print(f"formatted the %%writefile cells of {path.relative_to(ROOT)}")
    scripts = last_writefiles(notebooks)
    drift = 0
    for name, body in scripts.items():
        target = ROOT / "scripts" / name
        if target.exists() and target.read_text() == body:
            continue
        if args.check:
            print(f"scripts/{name} differs from its last %%writefile cell (run: make scripts)")
            drift += 1
        else:
            target.write_text(body)
            print(f"wrote scripts/{name}")
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
