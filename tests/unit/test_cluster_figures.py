"""parallel_course.cluster_figures: what chapter 10's figures put where, from the table
c10_multi_node_ranks.py printed and the torchrun arguments of its launch."""

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from parallel_course.cluster_figures import (
    describe_elastic,
    describe_gpus,
    describe_rendezvous,
    draw_elastic,
    draw_gpu_choices,
    draw_rendezvous,
    elastic_figure,
    gpu_choices,
    gpu_figure,
    nodes_of,
    parse_elastic,
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


ELASTIC_ARGS = (
    "--nnodes=1:2 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29517 "
    "--rdzv-id=c10-elastic --rdzv-conf=last_call_timeout=1 --max-restarts=0"
)
WAITING_LINE = "WORLD_SIZE=1, TORCHELASTIC_RESTART_COUNT=0: waiting for more nodes\n"
ELASTIC_TABLE = "\n".join(
    "  ".join(f"{str(v):>22}" for v in row)
    for row in [HEADER, [0, 0, 0, 2, "cuda:0", "cuda:0"], [1, 1, 0, 2, "cuda:0", "cuda:1 (no such GPU)"]]
)
ELASTIC_END = "\n(one process per GPU: on every node cuda:0, ...)\nTORCHELASTIC_RESTART_COUNT on every process: [0]\n"


def test_elastic_logs_say_who_waited_who_is_rank_0_and_the_restart_counts():
    launch = parse_torchrun_args(ELASTIC_ARGS)
    assert launch.max_restarts == 0 and launch.nnodes == "1:2"
    join = parse_elastic(WAITING_LINE + ELASTIC_TABLE + ELASTIC_END, "")
    assert (join.first_world_size, join.first_restarts, join.table_node, join.restarts) == (1, 0, "A", [0])
    assert [join.node_of(p) for p in join.table] == ["A", "B"]
    # Rank 0's table in B's log: B is GROUP_RANK 0 in the second round.
    swapped = parse_elastic(WAITING_LINE, ELASTIC_TABLE + ELASTIC_END)
    assert [swapped.node_of(p) for p in swapped.table] == ["B", "A"]
    with pytest.raises(ValueError, match="did not start alone"):
        parse_elastic(ELASTIC_TABLE + ELASTIC_END, "")
    with pytest.raises(ValueError, match="one log"):
        parse_elastic(WAITING_LINE + ELASTIC_TABLE + ELASTIC_END, ELASTIC_TABLE + ELASTIC_END)


def test_elastic_drawing_puts_each_second_round_worker_in_its_nodes_lane():
    launch = parse_torchrun_args(ELASTIC_ARGS)
    join = parse_elastic(WAITING_LINE, ELASTIC_TABLE + ELASTIC_END)
    ax = Figure().subplots()
    draw_elastic(ax, join, launch)
    lane = {t.get_text(): t.get_position()[1] for t in ax.texts}
    # B holds rank 0's table: its lane (the lower one, y 0) has RANK 0, A's RANK 1.
    assert lane["RANK 0, GROUP_RANK 0\nWORLD_SIZE 2"] < lane["RANK 1, GROUP_RANK 1\nWORLD_SIZE 2"]
    assert lane["node B"] < lane["node A"]
    assert "restart count on every process after the join: [0]; --max-restarts=0: none used up" in lane
    assert len(elastic_figure(join, launch).axes) == 1
    assert "Round 2: node B: RANK 0, GROUP_RANK 0, WORLD_SIZE 2; node A: RANK 1" in describe_elastic(join, launch)
    # Without the nodes, the same text whichever node the rendezvous made GROUP_RANK 0.
    other = parse_elastic(WAITING_LINE + ELASTIC_TABLE + ELASTIC_END, "")
    assert describe_elastic(join, launch, nodes=False) == describe_elastic(other, launch, nodes=False)
    assert "node A:" not in describe_elastic(join, launch, nodes=False)
