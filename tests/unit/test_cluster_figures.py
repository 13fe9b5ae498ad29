"""parallel_course.cluster_figures: what chapter 10's figures put where, from the table
c10_multi_node_ranks.py printed and the torchrun arguments of its launch."""

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from parallel_course.cluster_figures import (
    describe_gpus,
    describe_rendezvous,
    draw_gpu_choices,
    draw_rendezvous,
    gpu_choices,
    gpu_figure,
    nodes_of,
    parse_rank_table,
    parse_torchrun_args,
    rank_formula,
    rendezvous_figure,
)

# As c10_multi_node_ranks.py prints it: two nodes of two processes, in rank 0's node's log.
HEADER = ["RANK", "GROUP_RANK (node)", "LOCAL_RANK", "WORLD_SIZE", "device from LOCAL_RANK", "device from RANK (M6)"]
ROWS = [
    [0, 0, 0, 4, "cuda:0", "cuda:0"],
    [1, 0, 1, 4, "cuda:1", "cuda:1"],
    [2, 1, 0, 4, "cuda:0", "cuda:2 (no such GPU)"],
    [3, 1, 1, 4, "cuda:1", "cuda:3 (no such GPU)"],
]
TABLE = "\n".join(
    ["  ".join(f"{str(v):>22}" for v in row) for row in [HEADER, *ROWS]]
    + [
        "(one process per GPU: on every node cuda:0 to cuda:1, for a GPU job; this one ran on the CPU (gloo))",
        "TORCHELASTIC_RESTART_COUNT on every process: [0]",
    ]
)
ARGS = "--nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29517 --rdzv-id=c10"


def test_parse_reads_every_row_and_stops_at_the_notes():
    table = parse_rank_table(TABLE)
    assert [(p.rank, p.group_rank, p.local_rank, p.world_size) for p in table] == [
        (0, 0, 0, 4),
        (1, 0, 1, 4),
        (2, 1, 0, 4),
        (3, 1, 1, 4),
    ]
    assert table[3].by_local_rank == "cuda:1" and table[3].by_rank == "cuda:3 (no such GPU)"


def test_parse_refuses_an_output_without_the_table_or_with_rows_out_of_order():
    with pytest.raises(ValueError, match="RANK column"):
        parse_rank_table("WORLD_SIZE=1, TORCHELASTIC_RESTART_COUNT=0: waiting for more nodes\n")
    lines = TABLE.splitlines()
    with pytest.raises(ValueError, match="in order"):
        parse_rank_table("\n".join([lines[0], lines[2], lines[1]]))


def test_torchrun_arguments_in_either_spelling():
    launch = parse_torchrun_args(ARGS)
    assert (launch.nnodes, launch.nproc_per_node, launch.rdzv_backend, launch.rdzv_endpoint, launch.rdzv_id) == (
        "2",
        2,
        "c10d",
        "127.0.0.1:29517",
        "c10",
    )
    assert (
        parse_torchrun_args(
            "--nnodes 1:2 --nproc-per-node 1 --rdzv_backend c10d --rdzv_endpoint h:1 --rdzv_id x"
        ).nnodes
        == "1:2"
    )
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        parse_torchrun_args("--nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-id=c10")


def test_nodes_hold_their_processes_and_rank_is_made_from_group_and_local_rank():
    nodes = nodes_of(parse_rank_table(TABLE))
    assert [(n.group_rank, [p.rank for p in n.processes]) for n in nodes] == [(0, [0, 1]), (1, [2, 3])]
    assert rank_formula(nodes[1].processes[1], 2) == "1×2+1"
    # A table whose RANKs do not follow the formula is refused, not drawn.
    with pytest.raises(ValueError, match="RANK 3"):
        rank_formula(nodes[1].processes[1], 3)


def test_gpu_choices_follow_the_table_and_mark_the_gpus_a_node_lacks():
    choices = gpu_choices(parse_rank_table(TABLE))
    assert [(c.by_local_rank, c.by_rank, c.rank_gpu_exists) for c in choices] == [
        (0, 0, True),
        (1, 1, True),
        (0, 2, False),
        (1, 3, False),
    ]
    # The table says a GPU is missing that the node has: the figure would contradict it.
    with pytest.raises(ValueError, match="disagrees"):
        gpu_choices(
            parse_rank_table(
                TABLE.replace(f"{'cuda:1':>22}  {'cuda:1':>22}", f"{'cuda:1':>22}  {'cuda:1 (no such GPU)':>22}")
            )
        )


def test_draws_a_box_per_process_per_node_and_the_ghost_gpus():
    table, launch = parse_rank_table(TABLE), parse_torchrun_args(ARGS)
    ax = Figure().subplots()
    draw_rendezvous(ax, nodes_of(table), launch)
    texts = [t.get_text() for t in ax.texts]
    assert [t for t in texts if t.startswith("RANK ")] == [
        "RANK 0\nLOCAL_RANK 0\n= 0×2+0",
        "RANK 1\nLOCAL_RANK 1\n= 0×2+1",
        "RANK 2\nLOCAL_RANK 0\n= 1×2+0",
        "RANK 3\nLOCAL_RANK 1\n= 1×2+1",
    ]
    assert "c10d rendezvous store\nat 127.0.0.1:29517, id c10" in texts
    ax = Figure().subplots()
    draw_gpu_choices(ax, gpu_choices(table))
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("cuda:0") == 2 and texts.count("cuda:1") == 2
    assert "cuda:2\nno such GPU" in texts and "cuda:3\nno such GPU" in texts
    # Two arrows per process: by LOCAL_RANK and by RANK.
    arrows = [t for t in ax.texts if isinstance(t, Annotation)]
    assert len(arrows) == 2 * len(table)
    # The dashed (RANK) arrows of node 1 end on its 3rd and 4th slots, the ghosts.
    ghosts = sorted(p.get_x() for p in ax.patches if p.get_linestyle() == "--")
    ends = sorted(a.xy[0] for a in arrows if a.arrow_patch.get_linestyle() == "--")[-2:]
    assert len(ghosts) == 2 and all(g < e < g + 1.3 for g, e in zip(ghosts, ends))
    assert len(rendezvous_figure(table, launch).axes) == 1 and len(gpu_figure(table).axes) == 1


def test_describe_leaves_the_port_out_and_says_who_takes_which_gpu():
    table, launch = parse_rank_table(TABLE), parse_torchrun_args(ARGS)
    text = describe_rendezvous(table, launch)
    assert "29517" not in text
    assert "Node GROUP_RANK 1 starts RANK 2 (LOCAL_RANK 0), RANK 3 (LOCAL_RANK 1)." in text
    assert "RANK 3 on node 1: by LOCAL_RANK cuda:1, by RANK cuda:3, a GPU the node does not have." in describe_gpus(
        table
    )
