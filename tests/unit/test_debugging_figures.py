"""parallel_course.debugging_figures (chapter 14b): the flight records of every rank as a grid of
rank by collective sequence number."""

from parallel_course import debugging_figures as dfig


def entry(seq, op, sizes):
    """The fields of a torch 2.13 gloo flight-record entry that the reader uses."""
    return {
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "process_group": ["0", "default_pg"],
        "input_sizes": [list(sizes)],
        "output_sizes": [list(sizes)],
        "state": "scheduled",
        "is_p2p": False,
    }


STEPS = [entry(s, "all_reduce", [64, 64]) for s in (1, 2, 3)]
STUCK = {0: {"entries": [*STEPS, entry(4, "all_reduce", [64, 64])]}, 1: {"entries": list(STEPS)}}
MISMATCH = {
    0: {"entries": [*STEPS, entry(4, "all_gather", [64])]},
    1: {"entries": [*STEPS, entry(4, "all_reduce", [64, 64])]},
}


def test_a_rank_behind_leaves_its_cell_empty():
    grid = dfig.flight_grid(STUCK)
    assert grid.ranks == [0, 1] and grid.seqs == [1, 2, 3, 4]
    assert grid.verdicts == ["agree", "agree", "agree", "behind"]
    assert grid.cells[1][3] is None and grid.cells[0][3].op == "all_reduce"
    alt = dfig.describe_flight_grid(grid)
    assert "#4: rank 0 all_reduce(64x64), rank 1 never entered it (some rank never entered it)." in alt


def test_ranks_that_entered_different_calls_disagree():
    grid = dfig.flight_grid(MISMATCH)
    assert grid.verdicts == ["agree", "agree", "agree", "mismatch"]
    assert [row[3].op for row in grid.cells] == ["all_gather", "all_reduce"]
    # The same operation with other sizes disagrees too.
    sizes = {0: {"entries": [entry(1, "all_reduce", [64])]}, 1: {"entries": [entry(1, "all_reduce", [32])]}}
    assert dfig.flight_grid(sizes).verdicts == ["mismatch"]


def test_only_the_last_sequence_numbers_are_drawn():
    long = {r: {"entries": [entry(s, "all_reduce", [8]) for s in range(1, 21)]} for r in (0, 1, 2)}
    grid = dfig.flight_grid(long, last=5)
    assert grid.seqs == [16, 17, 18, 19, 20] and grid.verdicts == ["agree"] * 5
    fig = dfig.flight_figure(grid, "t")
    (ax,) = fig.axes
    assert len(ax.patches) == 3 * 5


def test_describe_step_split_names_the_straggler_and_keeps_times_out_of_the_plain_text():
    medians = [{"step": 0.2, "outside": 0.001, "inside": 0.202}, {"step": 0.2, "outside": 0.201, "inside": 0.002}]
    alt, plain = dfig.describe_step_split(medians, [1])
    assert "rank 0: outside 0.001, inside 0.202; rank 1: outside 0.201, inside 0.002" in alt
    assert "straggler found, most time outside: rank 1" in alt and "rank 1" in plain
    assert "0.2" not in plain
    assert "none" in dfig.describe_step_split(medians, [])[1]
