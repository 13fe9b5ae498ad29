"""Labs are what nbgrader's generate step makes of the solutions, and an untouched lab stops only
where the student has work to do, and scores zero.

Every lab of labs/ is handed in untouched and autograded by nbgrader (tools/nbgrader_course.py), as
make grade does: each runs in a folder of its own, its check cells (first line ``# check it``) as
the tests. A solution cell of a lab raises NotImplementedError when run. A solution cell that
writes a script (``%%writefile``) cannot raise; the check cell that launches the script raises
NotImplementedError for it (``parallel_course.launch.torchrun``).
"""

import json
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import load_script
from make_labs import drift, student_versions
from nbgrader_course import CHECK, CHECK_POINTS, answer_cells, autograde, check_cells, grades, notebook_path, submit
from parallel_course.launch import run_bounded

# Runs every lab notebook and launches their checkers: handed out after the notebooks.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted((ROOT / "labs").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
LEAK_SEARCH = Path(__file__).with_name("lab_leaks.py")
STUDENT = "untouched"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """nbgrader's course, generated as make labs generates it, with every lab of labs/ handed in
    untouched and autograded: (the course folder, the student versions make labs would write, the
    scores of the graded cells)."""
    folder = tmp_path_factory.mktemp("course")
    expected = student_versions(folder)
    for lab in LABS:
        submit(folder, STUDENT, lab.stem, lab)
    # Today about a minute for all of them; each cell is bounded too (tools/nbgrader_config.py).
    autograde(folder, timeout=600)
    return folder, expected, grades(folder)


def test_labs_are_what_the_generator_makes(course):
    stale, orphans = drift(course[1])
    assert not stale, f"labs drifted from solutions (run: make labs): {[p.name for p in stale]}"
    assert not orphans, f"labs without a solution: {[p.name for p in orphans]}"


def test_every_solution_has_a_lab():
    solutions = {p.name for p in (ROOT / "solutions").glob("*.ipynb")}
    assert solutions == {p.name for p in LABS}


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_lab_stops_only_at_not_implemented(lab, course):
    nb = nbformat.read(notebook_path(course[0] / "autograded", STUDENT, lab.stem), as_version=4)

    def error(cell):
        return next((o for o in cell.get("outputs", []) if o.output_type == "error"), None)

    code = [c for c in nb.cells if c.cell_type == "code"]
    todo = [c for c in answer_cells(nb) if c.cell_type == "code"]
    assert todo, "a lab needs at least one cell for the student to complete"
    for cell in todo:
        if cell.source.startswith("%%writefile"):
            continue  # it only writes the file; the check cell that runs it raises
        err = error(cell)
        assert err is not None and err.ename == "NotImplementedError", (
            f"a solution cell should stop with NotImplementedError, got "
            f"{err.ename + ': ' + err.evalue if err else 'no error'}:\n{cell.source}"
        )
    first = next(c for c in code if error(c))
    assert error(first).ename == "NotImplementedError", (
        f"the first error must be the student's NotImplementedError, but this cell failed "
        f"with {error(first).ename}: {error(first).evalue}\n{first.source}"
    )


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_every_check_is_graded_and_an_untouched_lab_scores_zero(lab, course):
    nb = nbformat.read(lab, as_version=4)
    checks = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(CHECK)]
    assert checks, f"no code cell starts with {CHECK!r}: the lab has nothing to grade"
    assert check_cells(nb) == checks, f"the graded cells are not the cells that start with {CHECK!r}"
    scored = course[2][STUDENT, lab.stem]
    assert scored == {c.metadata.nbgrader.grade_id: (0, CHECK_POINTS) for c in checks}


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_no_check_cell_shows_a_value(solution):
    """nbgrader scores a graded cell by its value when it shows one that reads as a number (partial
    credit): a check cell ending in a call that returns 0.0 scores a solved lab 0. The stored
    outputs are what a run shows (strict nbval compares them)."""
    nb = nbformat.read(solution, as_version=4)
    checks = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(CHECK)]
    shown = [c.source.splitlines()[-1] for c in checks if any(o.output_type == "execute_result" for o in c.outputs)]
    assert not shown, f"check cells that end with a value (end them with a statement): {shown}"


def _solution_regions(source):
    """The code between ### BEGIN SOLUTION and ### END SOLUTION, one list of (line number, line) per
    region, numbered from 1 as the cell's lines are."""
    regions, current = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        if "### BEGIN SOLUTION" in line:
            current = []
        elif "### END SOLUTION" in line:
            regions.append(current)
            current = None
        elif current is not None:
            current.append((number, line))
    return regions


def _distinctive(lines):
    """Lines that say something: whitespace normalised, no comments, no short lines like `return x`."""
    normal = (" ".join(line.split()) for line in lines)
    return [line for line in normal if len(line) >= 20 and not line.startswith(("#", '"""'))]


def _behaviour_checked(solution, leak_search):
    """The line numbers, per code cell of ``solution``, of its answers that the leak search checked in
    the kernel (``checked``: every importable candidate tried in the answer's place). An answer whose
    name is not the solution's only one of that name is left out: the search reports by name."""
    leaks = load_script(LEAK_SEARCH)
    cells = leaks.code_cells(solution)
    found = [(index, answer) for index, source in enumerate(cells) for answer in leaks.answers([source])]
    names = [answer["name"] for _, answer in found]
    report = leak_search["labs"][solution.name]
    lines = {}
    for index, answer in found:
        if names.count(answer["name"]) == 1 and report.get(answer["name"], {}).get("checked"):
            first, last = answer["lines"]
            lines.setdefault(index, set()).update(range(first, last + 1))
    return lines


def _shown_by_text(shown, solutions, leak_search):
    """The answers of ``solutions`` that ``shown`` ({where: its lines, whitespace normalised}) shows as
    text: most of a solution region's distinctive lines (60 %, at least 2) in one file. A region's
    lines inside an answer the leak search checked in the kernel are left to that search; what is left
    (answers checked only by launches, and code of a region outside any answer) is compared."""
    leaks = []
    for solution in solutions:
        checked = _behaviour_checked(solution, leak_search)
        cells = [c for c in nbformat.read(solution, as_version=4).cells if c.cell_type == "code"]
        for index, cell in enumerate(cells):
            for region in _solution_regions(cell.source):
                lines = _distinctive(line for number, line in region if number not in checked.get(index, ()))
                for where, seen in shown.items():
                    hits = [line for line in lines if line in seen]
                    if len(hits) >= max(2, 0.6 * len(lines)):
                        leaks.append(
                            f"{solution.name}: {len(hits)} of {len(lines)} lines of an answer are in {where}, "
                            f"e.g. {hits[0]!r}"
                        )
    return leaks


def test_no_lab_answer_is_shown_outside_solutions(leak_search):
    """A lab's answer that the leak search does not check in the kernel (its checks launch processes:
    no candidate can be tried in its place), and a solution region's code outside any answer, appear
    in no lecture, script or package module as text; the answers the search checks are its own.

    A region counts as shown when most of its distinctive lines (60 %, at least 2) appear in one
    other file; a bug-hunt's fixed script shares the course's conventions with the lectures, but
    never most of its lines."""
    shown = {}
    for path in [
        *(ROOT / "notebooks").glob("*.ipynb"),
        *(ROOT / "scripts").rglob("*.py"),
        *(ROOT / "src").rglob("*.py"),
    ]:
        text = (
            "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
            if path.suffix == ".ipynb"
            else path.read_text()
        )
        shown[path.relative_to(ROOT)] = {" ".join(line.split()) for line in text.splitlines()}
    leaks = _shown_by_text(shown, SOLUTIONS, leak_search)
    assert not leaks, "\n".join(leaks)


def test_the_text_comparison_finds_a_shown_answer(leak_search):
    """An answer checked only by launches (lab 03's ring), planted as text in a file, is found; one the
    leak search checks in the kernel (lab 02's replica losses) is left to that search, though the
    comparison would find it too."""
    ring = ROOT / "solutions" / "lab03_ring_allreduce.ipynb"
    losses = ROOT / "solutions" / "lab02_manual_data_parallel.ipynb"
    assert not leak_search["labs"][ring.name]["ring_allreduce"]["checked"]
    assert leak_search["labs"][losses.name]["my_replica_losses"]["checked"]
    planted = set()
    for solution, marker in [(ring, "def ring_allreduce("), (losses, "def my_replica_losses(")]:
        source = next(c.source for c in nbformat.read(solution, as_version=4).cells if marker in c.source)
        planted |= {" ".join(line.split()) for region in _solution_regions(source) for _, line in region}

    def found(search):
        return [leak.split(":")[0] for leak in _shown_by_text({"planted.py": planted}, [ring, losses], search)]

    assert found(leak_search) == [ring.name]
    nothing_checked = {"labs": {ring.name: {}, losses.name: {}}}
    assert found(nothing_checked) == [ring.name, losses.name]


# Lab 07a as it once was: 1F1B's order, checked against orders written out by hand. The package's
# one_f_one_b_orders answers it under another name; the leak search must say so.
OLD_LAB_07A = [
    "from parallel_course.checks import check_equal",
    """def one_f_one_b(n_stages, n_microbatches):
    ### BEGIN SOLUTION
    p, m = n_stages, n_microbatches
    orders = []
    for stage in range(p):
        warmup = min(p - 1 - stage, m)
        order = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", i) for i in range(m - warmup, m)]
        orders.append(order)
    return orders
    ### END SOLUTION""",
    """# check it
F, B = "F", "B"
check_equal("2 stages, 3 micro-batches", one_f_one_b(2, 3),
            [[(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (B, 2)], [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2)]])
check_equal("3 stages, 2 micro-batches", one_f_one_b(3, 2),
            [[(F, 0), (F, 1), (B, 0), (B, 1)]] * 2 + [[(F, 0), (B, 0), (F, 1), (B, 1)]])""",
]


# Two labs whose answers the search must try, or say that it could not. The first's answer lives in a
# file that imports the file beside it (as lab 05's BucketedDDP does), and no cell puts that folder on
# the path before the check: the search must still define the solution and try the candidates. The
# second's check reads the answer's name before calling it: a cell raises before any call, so nothing
# is tried, and the search must say its trial broke (not "not called", which reads as no leak).
PLANTED_SIBLING = [
    "%%writefile work/planted_helper.py\ndef helper(a, b, c, d, e):\n    return a + b + c + d + e\n",
    """%%writefile work/planted_sum.py
from planted_helper import helper


def five_sum(a, b, c, d, e):
    ### BEGIN SOLUTION
    return helper(a, b, c, d, e)
    ### END SOLUTION""",
    """# check it
import sys
sys.path.insert(0, "work")
import planted_sum
assert planted_sum.five_sum(1, 2, 3, 4, 5) == 15""",
]
PLANTED_BROKEN = [
    """def add_one(x):
    ### BEGIN SOLUTION
    return x + 1
    ### END SOLUTION""",
    """# check it: the answer's name, then what it returns
print(add_one.__name__)
assert add_one(1) == 2""",
]


def _notebook(cells: list[str], path: Path) -> Path:
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]}))
    return path


def _planted_answers(solution: Path, into: Path) -> Path:
    """A module holding a solution's answers, each renamed: what an importable answer looks like."""
    leaks = load_script(LEAK_SEARCH)
    cells = leaks.code_cells(solution)
    code = [a["definition"].replace(f"{a['name']}(", f"planted_{a['name']}(", 1) for a in leaks.answers(cells)]
    path = into / "planted_answers.py"
    path.write_text("\n\n\n".join(code) + "\n")
    return path


@pytest.fixture(scope="module")
def leak_search(tmp_path_factory):
    """One search (tests/course/lab_leaks.py) over every solution, with two that must be caught: a
    module planted on the path with lab 07a's answers under other names, and lab 07a's old task; and
    two planted labs whose trials must run (an answer in a file importing its neighbour) or be said
    to have broken."""
    tmp = tmp_path_factory.mktemp("leaks")
    planted_labs = [
        _notebook(OLD_LAB_07A, tmp / "old_lab07a.ipynb"),
        _notebook(PLANTED_SIBLING, tmp / "planted_sibling.ipynb"),
        _notebook(PLANTED_BROKEN, tmp / "planted_broken.ipynb"),
    ]
    planted = _planted_answers(ROOT / "solutions" / "lab07_pipeline_schedule.ipynb", tmp)
    (tmp / "work").mkdir()
    command = [sys.executable, str(LEAK_SEARCH), "--work", str(tmp / "work"), "--plant", str(planted)]
    result = run_bounded([*command, *map(str, SOLUTIONS), *map(str, planted_labs)], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    print(f"leak search: {report['import_seconds']} s to import, {report['seconds']} s in all", report["lab_seconds"])
    return report


def _search_findings(leak_search, labs):
    """(answers that an importable candidate passes, answers whose trial did not run as designed,
    answers left to launches) of these labs (names of notebooks)."""
    ran_as_designed = load_script(LEAK_SEARCH).ran_as_designed
    leaks, broken, unchecked = [], [], []
    for lab in labs:
        for name, entry in leak_search["labs"][lab].items():
            if not ran_as_designed(entry):
                broken.append(f"{lab}: {name}: {entry['why']}")
            elif not entry["checked"]:
                unchecked.append(f"{lab}: {name}: {entry['why']}")
            passed = [label for label in entry["passed"] if not label.startswith("planted:")]
            leaks += [f"{lab}: {label} passes the checks of {name}" for label in passed]
    return leaks, broken, unchecked


def test_no_importable_function_passes_a_labs_check(leak_search):
    """No function or class that a lab can import (the package, scripts/) passes a lab's in-kernel
    checks in place of the student's answer, whatever its name; and every answer's trial ran: one
    that broke tried nothing, which is not "no leak"."""
    leaks, broken, unchecked = _search_findings(leak_search, [solution.name for solution in SOLUTIONS])
    print("answers checked only by launches (the text comparison covers them):", *unchecked, sep="\n  ")
    assert not broken, "the leak search tried nothing for these answers:\n" + "\n".join(broken)
    lab07 = leak_search["labs"]["lab07_pipeline_schedule.ipynb"]
    assert all(lab07[name]["checked"] and lab07[name]["candidates"] for name in ("budget_orders", "step_slots"))
    # Lab 15's answers are checked in the kernel: a package function of the same signature would be found.
    lab15 = leak_search["labs"]["lab15_global_norm.ipynb"]
    assert all(lab15[name]["checked"] and lab15[name]["candidates"] for name in ("global_norm", "clip_"))
    assert not leaks, "\n".join(leaks)


def test_the_leak_search_finds_an_importable_answer(leak_search):
    lab07 = leak_search["labs"]["lab07_pipeline_schedule.ipynb"]
    for name in ("budget_orders", "step_slots"):
        assert f"planted:planted_answers.py:planted_{name}" in lab07[name]["passed"], lab07[name]
    old = leak_search["labs"]["old_lab07a.ipynb"]["one_f_one_b"]
    assert "parallel_course.model_parallel:one_f_one_b_orders" in old["passed"], old


def test_a_trial_that_breaks_is_not_counted_as_no_leak(leak_search):
    """An answer in a file that imports its neighbour is tried like any other (lab 05's BucketedDDP once
    broke the search: its file's import was not found); a check that raises before the answer's first
    call tries nothing, and the findings say so instead of passing it as "no leak"."""
    sibling = leak_search["labs"]["planted_sibling.ipynb"]["five_sum"]
    assert sibling["checked"] and sibling["candidates"], sibling
    assert _search_findings(leak_search, ["planted_sibling.ipynb"])[:2] == ([], [])
    broken = leak_search["labs"]["planted_broken.ipynb"]["add_one"]
    assert not broken["checked"] and broken["why"].startswith("the trial broke: AttributeError"), broken
    leaks, found, _ = _search_findings(leak_search, ["planted_broken.ipynb"])
    assert not leaks and len(found) == 1 and "add_one" in found[0], found
