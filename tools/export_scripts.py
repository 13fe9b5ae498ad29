"""Export scripts/<name>.py from the last `%%writefile work/<name>.py` cell of the course.

A long script is written in parts: one `%%writefile work/<name>.py` cell, then
`%%writefile -a work/<name>.py` cells that append to it (no cell over 100 lines). The export is
what the last write and the appends after it leave in work/, byte for byte as IPython writes it.

    python tools/export_scripts.py          # write scripts/
    python tools/export_scripts.py --check  # exit 1 if scripts/ differs from the notebooks

Lecture notebooks are read in chapter order, so a script that grows over several chapters is
exported in its final form.
"""

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
# [ \t]*, not \s*: the blank lines that open an appended part belong to the script.
WRITEFILE = re.compile(r"^%%writefile[ \t]+(-a[ \t]+)?work/(\S+)[ \t]*\n")


def last_writefiles(notebooks: list[Path]) -> dict[str, str]:
    """File name -> what the last %%writefile cell of that name and the appends after it write."""
    scripts: dict[str, str] = {}
    for path in notebooks:
        for cell in nbformat.read(path, as_version=4).cells:
            m = WRITEFILE.match(cell.source) if cell.cell_type == "code" else None
            if not m:
                continue
            append, name = m.groups()
            if append and name not in scripts:
                raise ValueError(f"{path.name}: %%writefile -a work/{name} before any %%writefile of it")
            # IPython writes the cell body followed by a newline.
            body = cell.source[m.end():].rstrip("\n") + "\n"
            scripts[name] = scripts[name] + body if append else body
    return scripts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift, write nothing")
    args = parser.parse_args()
    scripts = last_writefiles(sorted((ROOT / "notebooks").glob("*.ipynb")))
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
