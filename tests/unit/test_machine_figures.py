"""parallel_course.machine_figures: what chapter 00's figures put where."""

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from parallel_course.machine import Machine
from parallel_course.machine_figures import describe_machine, draw_machine, launch_rows, machine_picture, parse_launch

OUTPUT = """backend=gloo device=cpu
rank 0 of 4: all_reduce gave 10 (expected 10)
rank 1 of 4: all_reduce gave 10 (expected 10)
rank 2 of 4: all_reduce gave 10 (expected 10)
rank 3 of 4: all_reduce gave 10 (expected 10)
OK: every rank holds the sum
"""


def _machine(gpus=(), nccl=False, cores=2):
    return Machine("3.11", "2.13.0", None, cores, cores, list(gpus), {"gloo": True, "nccl": nccl, "mpi": False})


def test_parse_launch_reads_the_backend_and_every_ranks_result_in_rank_order():
    launch = parse_launch(OUTPUT)
    assert (launch.backend, launch.device, launch.world_size) == ("gloo", "cpu", 4)
    assert launch.results == [10.0] * 4 and launch.expected == 10.0
    with pytest.raises(ValueError, match="one line per rank"):
        parse_launch(OUTPUT.replace("rank 2 of 4", "rank 5 of 4"))
    with pytest.raises(ValueError, match="did not pass"):
        parse_launch(OUTPUT.replace("OK: every rank holds the sum", "FAIL: rank 1 holds 9"))


def test_launch_rows_start_each_rank_at_rank_plus_one_and_end_with_the_sum():
    rows = launch_rows(parse_launch(OUTPUT))
    assert [row.before[0].text for row in rows] == ["1", "2", "3", "4"]
    assert [(row.after[0].text, row.after[0].source) for row in rows] == [("10", "reduced")] * 4


def test_machine_picture_places_ranks_by_the_courses_rule_and_marks_the_backend_used():
    picture = machine_picture(_machine(), parse_launch(OUTPUT))
    assert picture.ranks == ["cpu"] * 4
    assert picture.backends == {"gloo": (True, True), "nccl": (False, False), "mpi": (False, False)}
    gpus = machine_picture(
        _machine(["H100"] * 4, nccl=True), parse_launch(OUTPUT.replace("backend=gloo", "backend=nccl"))
    )
    assert gpus.ranks == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_machine_picture_refuses_a_launch_the_rule_would_not_have_made():
    with pytest.raises(ValueError, match="picks gloo"):
        machine_picture(_machine(), parse_launch(OUTPUT.replace("backend=gloo", "backend=nccl")))


def test_draw_machine_draws_a_box_per_rank_backend_and_gpu_and_a_square_per_core():
    ax = Figure().subplots()
    picture = machine_picture(_machine(["H100"] * 4, nccl=True, cores=6), parse_launch(OUTPUT.replace("gloo", "nccl")))
    draw_machine(ax, picture)
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 4 + 3 + 4
    assert len(ax.patches) - len(boxes) == 6
    texts = {t.get_text() for t in ax.texts}
    assert {"rank 3\non cuda:3", "nccl: used", "gloo: built in, unused", "mpi: not built in", "cuda:2 H100"} <= texts
    # Every rank is joined to the backend, the backend to each GPU used.
    assert len(ax.lines) == 4 + 4


def test_draw_machine_says_when_processes_outnumber_the_cores():
    ax = Figure().subplots()
    draw_machine(ax, machine_picture(_machine(), parse_launch(OUTPUT)))
    assert "4 processes take turns on 2 cores" in {t.get_text() for t in ax.texts}
    assert "no GPU" in {t.get_text() for t in ax.texts}


def test_describe_machine_says_what_was_found_and_used():
    text = describe_machine(machine_picture(_machine(), parse_launch(OUTPUT)))
    assert text == (
        "This machine: 2 usable CPU cores and no GPU; backends built in: gloo. "
        "The launch test's 4 processes talked over gloo: rank 0 on cpu; rank 1 on cpu; rank 2 on cpu; rank 3 on cpu."
    )
