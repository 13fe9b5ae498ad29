"""Generate labs/*.ipynb from solutions/*.ipynb (nbgrader's solution markers).

python tools/make_labs.py          # write labs/
python tools/make_labs.py --check  # exit 1 if labs/ is not what this would write
"""

import argparse
import sys
from pathlib import Path

from labgen import lab_text  # tools/labgen.py, beside this file

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift, write nothing")
    args = parser.parse_args()
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    expected = {ROOT / "labs" / s.name: lab_text(s) for s in solutions}
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    orphans = sorted(set((ROOT / "labs").glob("*.ipynb")) - set(expected))
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
