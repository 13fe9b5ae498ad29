"""Export scripts/<name>.py from the last `%%writefile work/<name>.py` cell of the course.

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
WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?work/(\S+)\s*\n")


def last_writefiles(notebooks: list[Path]) -> dict[str, str]:
    """File name -> body of the last %%writefile cell that writes it."""
    scripts: dict[str, str] = {}
    for path in notebooks:
        for cell in nbformat.read(path, as_version=4).cells:
            m = WRITEFILE.match(cell.source) if cell.cell_type == "code" else None
            if m:
                if cell.source.startswith("%%writefile -a"):
                    raise ValueError(f"{path.name}: appending (%%writefile -a) is not exportable")
                # IPython writes the cell body followed by a newline.
                scripts[m.group(1)] = cell.source[m.end():].rstrip("\n") + "\n"
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
