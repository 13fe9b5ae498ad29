"""Generate labs/*.ipynb from solutions/*.ipynb with nbgrader's generate step.

python tools/make_labs.py          # write labs/
python tools/make_labs.py --check  # exit 1 if labs/ is not what this would write

Each solution gets nbgrader's cell metadata by rule (tools/nbgrader_course.py); nbgrader then
replaces every solution region with a stub, clears the outputs and locks the cells a student does
not edit. The course folder nbgrader works in is a temporary one (tools/grade.py keeps its own).
"""

import argparse
import sys
import tempfile
from pathlib import Path

from nbgrader_course import generate, write_course  # tools/nbgrader_course.py, beside this file

ROOT = Path(__file__).resolve().parent.parent


def student_versions(course: Path) -> dict[Path, str]:
    """Every solution's student version, made by nbgrader in ``course``: its path in labs/ -> its text."""
    write_course(course, sorted((ROOT / "solutions").glob("*.ipynb")))
    return {ROOT / "labs" / f"{lab}.ipynb": path.read_text() for lab, path in generate(course).items()}


def drift(expected: dict[Path, str]) -> tuple[list[Path], list[Path]]:
    """The labs that differ from (or lack) their student version, and the labs without a solution."""
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    orphans = sorted(set((ROOT / "labs").glob("*.ipynb")) - set(expected))
    return stale, orphans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift, write nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as course:
        expected = student_versions(Path(course))
    stale, orphans = drift(expected)
    if args.check:
        for p in stale:
            print(f"labs drifted from solutions: {p.relative_to(ROOT)} (run: make labs)")
        for p in orphans:
            print(f"lab without a solution: {p.relative_to(ROOT)}")
        return 1 if stale or orphans else 0
    for p in stale:
        p.write_text(expected[p])
        print(f"wrote {p.relative_to(ROOT)}")
    for p in orphans:
        print(f"warning: {p.relative_to(ROOT)} has no solution in solutions/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
