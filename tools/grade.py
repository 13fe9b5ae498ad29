"""Grade lab submissions with nbgrader: generate the student versions, autograde, write feedback.

python tools/grade.py                               # a demo: each solution, and each lab untouched
python tools/grade.py --submissions DIR             # DIR/<student>/<lab>/<lab>.ipynb (nbgrader's
                                                    # layout) or DIR/<student>/<lab>.ipynb
python tools/grade.py --labs lab02_manual_data_parallel --course build/grading

The course folder (build/grading/ by default) is made afresh (tools/nbgrader_course.py says what is
in it); a submission runs in its own folder there, with its own work/. Each check cell (first line
``# check it``) scores its points when it runs without an error. Prints a table of the scores;
the feedback is one HTML page per notebook in <course>/feedback/<student>/<lab>/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nbgrader_course import (
    SOLUTIONS,
    autograde,
    generate,
    generate_feedback,
    grades,
    notebook_path,
    submit,
    write_course,
)

ROOT = Path(__file__).resolve().parent.parent
DEMO = {"demo-solved": "source", "demo-untouched": "release"}
# Per notebook: a lab's solution runs in about a minute on 2 cores; its check cells bound their launches.
SECONDS_PER_NOTEBOOK = 300


def submissions_in(folder: Path, labs: list[str]) -> dict[tuple[str, str], Path]:
    """(student, lab) -> notebook, for every notebook of a lab in ``folder``'s student folders."""
    found = {}
    for student in sorted(p for p in folder.iterdir() if p.is_dir()):
        for lab in labs:
            for path in (student / lab / f"{lab}.ipynb", student / f"{lab}.ipynb"):
                if path.is_file():
                    found[student.name, lab] = path
                    break
    return found


def demo_submissions(course: Path, labs: list[str]) -> dict[tuple[str, str], Path]:
    """Each lab as a student hands it in solved (its solution) and untouched (as released)."""
    return {
        (student, lab): notebook_path(course / folder, None, lab) for student, folder in DEMO.items() for lab in labs
    }


def grade(course: Path, labs: list[str], submissions: Path | None) -> dict[tuple[str, str], dict]:
    """Everything ``make grade`` does, in ``course``; returns the scores (nbgrader_course.grades)."""
    handed_in = submissions_in(submissions, labs) if submissions else demo_submissions(course, labs)
    if not handed_in:
        raise SystemExit(f"no submissions of {', '.join(labs)} in {submissions}")
    write_course(course, [SOLUTIONS / f"{lab}.ipynb" for lab in labs])
    generate(course)
    for (student, lab), notebook in handed_in.items():
        submit(course, student, lab, notebook)
    autograde(course, timeout=SECONDS_PER_NOTEBOOK * len(handed_in))
    generate_feedback(course, timeout=120 + 10 * len(handed_in))
    return grades(course)


def table(scores: dict[tuple[str, str], dict]) -> str:
    lines = [f"{'student':<20} {'lab':<32} {'score':>9}"]
    for (student, lab), cells in sorted(scores.items()):
        got, most = sum(s for s, _ in cells.values()), sum(m for _, m in cells.values())
        lines.append(f"{student:<20} {lab:<32} {got:>4g} / {most:g}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--course", type=Path, default=ROOT / "build" / "grading", help="nbgrader's course folder")
    parser.add_argument("--submissions", type=Path, help="a folder of student folders (default: the demo)")
    parser.add_argument("--labs", nargs="+", help="lab names (default: every lab in solutions/)")
    args = parser.parse_args()
    labs = args.labs or sorted(p.stem for p in SOLUTIONS.glob("*.ipynb"))
    unknown = [lab for lab in labs if not (SOLUTIONS / f"{lab}.ipynb").is_file()]
    if unknown:
        parser.error(f"no solution for {', '.join(unknown)} in solutions/")
    if args.submissions and not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    course = args.course.resolve()
    if args.submissions and args.submissions.resolve().is_relative_to(course):
        parser.error(f"keep the submissions out of {course}: each run makes that folder afresh")
    print(table(grade(course, labs, args.submissions.resolve() if args.submissions else None)))
    print(f"\nfeedback: {course / 'feedback'}/<student>/<lab>/<lab>.html; nbgrader's log: {course / 'nbgrader.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
