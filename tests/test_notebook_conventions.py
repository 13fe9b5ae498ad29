"""The conventions every notebook keeps (opening, closing, kernel, ignored outputs; see the
instructor guide, notebooks/README.md), and the explorers reacting to their controls."""

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ALL = LECTURES + sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_standard_kernel_and_no_stored_widget_state(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert "widgets" not in nb.metadata, "stored widget state: re-store outputs with make outputs"


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_outputs_are_ignored_only_where_they_describe_the_machine(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if "NBVAL_IGNORE_OUTPUT" in cell.source:
            code = [line for line in cell.source.splitlines() if line.strip() and not line.startswith("#")]
            assert code in (["machine.versions()"], ["machine.report()"]), cell.source


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_opens_and_closes_the_course_way(path):
    cells = nbformat.read(path, as_version=4).cells
    assert cells[0].source.startswith(f"# {path.name[:2]} · ")
    opening = cells[1].source
    for part in ("**After this notebook you can**", "**Time**", "**Prerequisites**", "**Runs on**"):
        assert part in opening, f"{path.name}: opening lacks {part}"
    assert any("machine.versions()" in c.source for c in cells[:5])
    assert cells[-1].source.startswith("## What you have now")


def test_explorers_follow_their_controls():
    from parallel_course.pipeline_widget import pipeline_explorer
    from parallel_course.ring_widget import ring_allreduce_explorer
    from parallel_course.zero_widget import zero_calculator

    pipe = pipeline_explorer(n_stages=2, n_microbatches=2)
    before = pipe.result.value
    pipe.microbatches.value = 6
    assert pipe.result.value != before and "m = 6" in pipe.result.value

    ring = ring_allreduce_explorer(n=3)
    before = ring.view.value
    ring.n.value = 5
    assert ring.view.value != before and ring.step.max == 2 * (5 - 1)

    zero = zero_calculator(n_ranks=64)
    before = (zero.result.value, zero.plot.value)
    ranks = zero.controls["n_ranks"]
    ranks.value = ranks.options[0]
    assert zero.kwargs["n_ranks"] == ranks.options[0]
    assert zero.result.value != before[0] and zero.plot.value != before[1]
