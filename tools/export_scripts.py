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
import sys
from pathlib import Path

from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parent.parent


def last_writefiles(notebooks: list[Path]) -> dict[str, str]:
    """File name -> its last version, over the notebooks in order (parallel_course.scriptdiff)."""
    scripts: dict[str, str] = {}
    for path in notebooks:
        scripts.update({name: versions[-1] for name, versions in written_scripts(path).items()})
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
