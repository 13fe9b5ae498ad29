"""Chapter 10's figures, drawn from its own launch: the ranks of a job on two nodes (RANK,
LOCAL_RANK, GROUP_RANK, WORLD_SIZE) and the rendezvous that handed them out, and which GPU each
process takes by LOCAL_RANK and by RANK (M6), all read from the table ``c10_multi_node_ranks.py``
printed and the torchrun arguments the chapter launched it with.

``parse_rank_table`` and ``parse_torchrun_args`` read those, ``nodes_of`` and ``gpu_choices``
compute what is drawn where; the ``draw_`` functions only place it on Axes."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch

from .collective_figures import RANK_COLOURS

# The table's columns, as c10_multi_node_ranks.py names them.
COLUMNS = {
    "RANK": "rank",
    "GROUP_RANK (node)": "group_rank",
    "LOCAL_RANK": "local_rank",
    "WORLD_SIZE": "world_size",
    "device from LOCAL_RANK": "by_local_rank",
    "device from RANK (M6)": "by_rank",
}


@dataclass
class Process:
    """One row of the table: who the process is, and the device it takes each way."""

    rank: int
    group_rank: int
    local_rank: int
    world_size: int
    by_local_rank: str
    by_rank: str


def parse_rank_table(output: str) -> list[Process]:
    """The rows of the table rank 0 printed (columns apart by two spaces or more), in RANK order."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if re.split(r"\s{2,}", line.strip())[:1] == ["RANK"]]
    if not starts:
        raise ValueError("no table with a RANK column: not c10_multi_node_ranks.py's output")
    i = starts[0]
    header = re.split(r"\s{2,}", lines[i].strip())
    if set(header) != set(COLUMNS):
        raise ValueError(f"unexpected columns {header}")
    rows = []
    for line in lines[i + 1 :]:
        values = re.split(r"\s{2,}", line.strip())
        if len(values) != len(header) or not values[0].isdigit():
            break
        row = dict(zip((COLUMNS[h] for h in header), values))
        for key in ("rank", "group_rank", "local_rank", "world_size"):
            row[key] = int(row[key])
        rows.append(Process(**row))
    if [p.rank for p in rows] != list(range(len(rows))) or not rows:
        raise ValueError("the table's rows are not RANK 0, 1, ... in order")
    return rows


@dataclass
class Launch:
    """What every node's torchrun was told: how many nodes and processes, and where to meet."""

    nnodes: str
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int | None = None


def parse_torchrun_args(args: str) -> Launch:
    """The rendezvous arguments of a torchrun command line (``--key=value`` or ``--key value``;
    ``rdzv_endpoint`` and ``rdzv-endpoint`` alike)."""
    found, words = {}, shlex.split(args)
    for i, word in enumerate(words):
        if word.startswith("--"):
            key, _, value = word[2:].partition("=")
            if not value and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value = words[i + 1]
            found[key.replace("-", "_")] = value
    missing = [k for k in ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id") if k not in found]
    if missing:
        raise ValueError(f"no {', '.join('--' + k.replace('_', '-') for k in missing)} in the torchrun arguments")
    restarts = int(found["max_restarts"]) if "max_restarts" in found else None
    return Launch(
        found["nnodes"],
        int(found["nproc_per_node"]),
        found["rdzv_backend"],
        found["rdzv_endpoint"],
        found["rdzv_id"],
        restarts,
    )


@dataclass
class Node:
    """One node of the job: its GROUP_RANK (handed out at the rendezvous) and its processes."""

    group_rank: int
    processes: list[Process]


def nodes_of(table: list[Process]) -> list[Node]:
    """The processes grouped by node, in GROUP_RANK order, each node's in LOCAL_RANK order."""
    groups: dict[int, list[Process]] = {}
    for p in table:
        groups.setdefault(p.group_rank, []).append(p)
    return [Node(g, sorted(ps, key=lambda p: p.local_rank)) for g, ps in sorted(groups.items())]


def rank_formula(p: Process, nproc_per_node: int) -> str:
    """``RANK = GROUP_RANK × nproc_per_node + LOCAL_RANK`` with this process's numbers; refuses a
    row the formula does not give (the figure would state it)."""
    if p.group_rank * nproc_per_node + p.local_rank != p.rank:
        raise ValueError(f"RANK {p.rank} is not {p.group_rank} x {nproc_per_node} + {p.local_rank}")
    return f"{p.group_rank}×{nproc_per_node}+{p.local_rank}"


@dataclass
class GpuChoice:
    """Which of its node's GPUs a process takes by LOCAL_RANK, and which by RANK, and whether the
    node has that one (GPUs 0 .. gpus_per_node - 1)."""

    process: Process
    by_local_rank: int
    by_rank: int
    rank_gpu_exists: bool


def _index(device: str) -> int:
    m = re.match(r"cuda:(\d+)", device)
    if not m:
        raise ValueError(f"not a cuda:N device: {device!r}")
    return int(m.group(1))


def gpu_choices(table: list[Process]) -> list[GpuChoice]:
    """Per process, its two devices as the table printed them; a node has as many GPUs as
    processes (one process per GPU), so a RANK past them names a GPU the node does not have,
    which the table marks "(no such GPU)"."""
    per_node = {}
    for p in table:
        per_node[p.group_rank] = per_node.get(p.group_rank, 0) + 1
    choices = []
    for p in table:
        by_rank = _index(p.by_rank)
        exists = by_rank < per_node[p.group_rank]
        if exists == ("no such GPU" in p.by_rank):
            raise ValueError(f"RANK {p.rank}: {p.by_rank!r} disagrees with {per_node[p.group_rank]} GPUs per node")
        choices.append(GpuChoice(p, _index(p.by_local_rank), by_rank, exists))
    return choices


def _box(ax, x, y, w, h, text, face, fontsize=10, edge="black", style="-"):
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0,rounding_size=0.08",
            facecolor=face,
            edgecolor=edge,
            linestyle=style,
            linewidth=1,
        )
    )
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def draw_rendezvous(ax, nodes: list[Node], launch: Launch) -> None:
    """The store at the endpoint on top; below, a box per node (its torchrun and GROUP_RANK) with
    a box per process (RANK, LOCAL_RANK and how RANK is made from them)."""
    n = len(nodes)
    pw, gap = 1.7, 0.25
    node_w = max(len(node.processes) for node in nodes) * (pw + gap) + gap
    total = n * node_w + (n - 1) * 1.0
    store_w = 4.2
    sx = total / 2 - store_w / 2
    _box(
        ax,
        sx,
        3.4,
        store_w,
        0.9,
        f"{launch.rdzv_backend} rendezvous store\nat {launch.rdzv_endpoint}, id {launch.rdzv_id}",
        "#e9ecef",
        fontsize=12,
    )
    for k, node in enumerate(nodes):
        x0 = k * (node_w + 1.0)
        _box(ax, x0, 0, node_w, 2.55, "", "#f8f9fa", edge="0.4")
        ax.text(x0 + node_w / 2, 2.3, f"node: GROUP_RANK {node.group_rank}", ha="center", va="center", fontsize=13)
        ax.text(
            x0 + node_w / 2,
            1.98,
            f"torchrun --nnodes={launch.nnodes} --nproc_per_node={launch.nproc_per_node}",
            ha="center",
            va="center",
            fontsize=10,
            family="monospace",
        )
        for j, p in enumerate(node.processes):
            px = x0 + gap + j * (pw + gap)
            text = f"RANK {p.rank}\nLOCAL_RANK {p.local_rank}\n= {rank_formula(p, launch.nproc_per_node)}"
            _box(ax, px, 0.12, pw, 1.6, text, RANK_COLOURS[p.rank % len(RANK_COLOURS)], fontsize=11.5)
        # Join, then be told the node's number.
        cx = x0 + node_w / 2
        sx_mid = sx + store_w * (0.3 + 0.4 * k / max(n - 1, 1))
        ax.annotate(
            "", xy=(sx_mid - 0.15, 3.4), xytext=(cx - 0.15, 2.55), arrowprops={"arrowstyle": "-|>", "color": "0.3"}
        )
        ax.annotate(
            "", xy=(cx + 0.15, 2.55), xytext=(sx_mid + 0.15, 3.4), arrowprops={"arrowstyle": "-|>", "color": "#d62828"}
        )
        ax.text(
            (cx + sx_mid) / 2 + (0.55 if k else -0.55),
            2.97,
            f"joins; gets\nGROUP_RANK {node.group_rank}",
            ha="left" if k else "right",
            va="center",
            fontsize=11,
            color="#d62828",
        )
    world = nodes[0].processes[0].world_size
    ax.text(
        total / 2,
        -0.15,
        f"WORLD_SIZE = {n} nodes × {launch.nproc_per_node} processes = {world};  "
        f"RANK = GROUP_RANK × {launch.nproc_per_node} + LOCAL_RANK",
        ha="center",
        va="top",
        fontsize=12.5,
    )
    ax.set(xlim=(-0.3, total + 0.3), ylim=(-0.65, 4.35), aspect="equal")
    ax.axis("off")


def draw_gpu_choices(ax, choices: list[GpuChoice]) -> None:
    """Per node, its processes above its GPUs: a green arrow to the GPU LOCAL_RANK picks, a red
    dashed one to the GPU RANK would pick, ending on a dashed ghost where the node has no such GPU."""
    nodes = nodes_of([c.process for c in choices])
    by_proc = {c.process.rank: c for c in choices}
    w, gap = 1.3, 0.3
    x = 0.0
    for node in nodes:
        gpus = len(node.processes)
        wanted = max(by_proc[p.rank].by_rank for p in node.processes) + 1
        slots = max(gpus, wanted)
        width = slots * (w + gap) + gap
        _box(ax, x, -0.2, width, 3.1, "", "#f8f9fa", edge="0.4")
        ax.text(x + gap, 2.7, f"node GROUP_RANK {node.group_rank}: {gpus} GPUs", ha="left", va="center", fontsize=11)
        for g in range(slots):
            gx = x + gap + g * (w + gap)
            if g < gpus:
                _box(ax, gx, 0.0, w, 0.6, f"cuda:{g}", "#b7e4c7")
            elif any(by_proc[p.rank].by_rank == g for p in node.processes):
                _box(ax, gx, 0.0, w, 0.6, f"cuda:{g}\nno such GPU", "white", fontsize=9, edge="#d62828", style="--")
        for j, p in enumerate(node.processes):
            c = by_proc[p.rank]
            px = x + gap + j * (w + gap)
            _box(
                ax,
                px,
                1.6,
                w,
                0.8,
                f"RANK {p.rank}\nLOCAL_RANK {p.local_rank}",
                RANK_COLOURS[p.rank % len(RANK_COLOURS)],
                fontsize=9,
            )
            start = px + w / 2
            for target, colour, style, dx in (
                (c.by_local_rank, "#2d6a4f", "-", -0.12),
                (c.by_rank, "#d62828", "--", 0.12),
            ):
                tx = x + gap + target * (w + gap) + w / 2
                ax.annotate(
                    "",
                    xy=(tx + dx, 0.6),
                    xytext=(start + dx, 1.6),
                    arrowprops={"arrowstyle": "-|>", "color": colour, "linestyle": style, "lw": 1.6},
                )
        x += width + 0.6
    ax.set(xlim=(-0.2, x - 0.4), ylim=(-0.4, 3.0), aspect="equal")
    ax.axis("off")


def rendezvous_figure(table: list[Process], launch: Launch) -> Figure:
    nodes = nodes_of(table)
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    fig.suptitle(
        f"{len(nodes)} nodes meet at the rendezvous, then start their processes (as the launch printed)", fontsize=13
    )
    draw_rendezvous(fig.subplots(), nodes, launch)
    return fig


def gpu_figure(table: list[Process]) -> Figure:
    choices = gpu_choices(table)
    fig = Figure(figsize=(11, 3.9), layout="constrained")
    fig.suptitle("Which GPU each process takes: by LOCAL_RANK, or by RANK (M6)", fontsize=13)
    draw_gpu_choices(fig.subplots(), choices)
    handles = [
        Line2D([], [], color="#2d6a4f", lw=2, label="torch.cuda.set_device(LOCAL_RANK)"),
        Line2D([], [], color="#d62828", lw=2, linestyle="--", label="torch.cuda.set_device(RANK) (M6)"),
        Patch(facecolor="#b7e4c7", edgecolor="black", label="a GPU of the node"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=11, frameon=False)
    return fig


def describe_rendezvous(table: list[Process], launch: Launch) -> str:
    """The text alternative (the endpoint's port left out: it is a free port, new every run)."""
    host = launch.rdzv_endpoint.rsplit(":", 1)[0]
    parts = [
        f"{len(nodes_of(table))} nodes, each running torchrun --nnodes={launch.nnodes} "
        f"--nproc_per_node={launch.nproc_per_node}, join the {launch.rdzv_backend} rendezvous store at {host} "
        f"(id {launch.rdzv_id}) and each gets a GROUP_RANK."
    ]
    for node in nodes_of(table):
        procs = ", ".join(f"RANK {p.rank} (LOCAL_RANK {p.local_rank})" for p in node.processes)
        parts.append(f"Node GROUP_RANK {node.group_rank} starts {procs}.")
    parts.append(f"WORLD_SIZE {table[0].world_size}; RANK = GROUP_RANK x {launch.nproc_per_node} + LOCAL_RANK.")
    return " ".join(parts)


def describe_gpus(table: list[Process]) -> str:
    parts = ["Which GPU each process takes, per node."]
    for c in gpu_choices(table):
        p = c.process
        verdict = (
            "the same GPU"
            if c.by_rank == c.by_local_rank
            else ("another GPU" if c.rank_gpu_exists else "a GPU the node does not have")
        )
        parts.append(
            f"RANK {p.rank} on node {p.group_rank}: by LOCAL_RANK cuda:{c.by_local_rank}, "
            f"by RANK cuda:{c.by_rank}, {verdict}."
        )
    return " ".join(parts)


# "WORLD_SIZE=1, TORCHELASTIC_RESTART_COUNT=0: waiting for more nodes"
WAITING = re.compile(r"^WORLD_SIZE=(\d+), TORCHELASTIC_RESTART_COUNT=(\d+): waiting for more nodes$", re.M)
RESTARTS = re.compile(r"^TORCHELASTIC_RESTART_COUNT on every process: \[([\d, ]*)\]$", re.M)


@dataclass
class ElasticJoin:
    """The elastic run as its two nodes' logs tell it: node A's first round (its world size and
    restart count while it waited), and the round after B joined: the node whose log holds rank
    0's table is GROUP_RANK 0, the table's rows, and the restart counts of every process."""

    first_world_size: int
    first_restarts: int
    table: list[Process]
    table_node: str
    restarts: list[int]

    def node_of(self, p: Process) -> str:
        """Which launcher ("A" or "B") a process of the second round ran under."""
        other = "B" if self.table_node == "A" else "A"
        return self.table_node if p.group_rank == 0 else other


def parse_elastic(log_a: str, log_b: str) -> ElasticJoin:
    """Both logs of the elastic run: A's waiting line, then rank 0's table in whichever log it is."""
    waiting = WAITING.search(log_a)
    if waiting is None:
        raise ValueError("node A's log has no 'waiting for more nodes' line: it did not start alone")
    with_table = [(name, log) for name, log in (("A", log_a), ("B", log_b)) if "GROUP_RANK (node)" in log]
    if len(with_table) != 1:
        raise ValueError(f"rank 0's table should be in one log, found in {len(with_table)}")
    name, log = with_table[0]
    restarts = RESTARTS.search(log)
    if restarts is None:
        raise ValueError("no 'TORCHELASTIC_RESTART_COUNT on every process' line")
    counts = [int(v) for v in restarts.group(1).split(",") if v.strip()]
    return ElasticJoin(int(waiting.group(1)), int(waiting.group(2)), parse_rank_table(log), name, counts)


def draw_elastic(ax, join: ElasticJoin, launch: Launch) -> None:
    """A lane per node, three columns: A alone in round 1, B's arrival (A's worker stopped, not
    counted), and round 2 with each worker's RANK, GROUP_RANK and WORLD_SIZE."""
    lanes = {"A": 1.3, "B": 0.0}
    for node, y in lanes.items():
        ax.text(-0.2, y + 0.45, f"node {node}", ha="right", va="center", fontsize=13)
    _box(
        ax,
        0.0,
        lanes["A"],
        3.2,
        0.9,
        f"WORLD_SIZE {join.first_world_size}, restart count {join.first_restarts}\nwaiting for more nodes",
        RANK_COLOURS[0],
        fontsize=11,
    )
    _box(ax, 0.0, lanes["B"], 3.2, 0.9, "not started yet", "white", fontsize=11, edge="0.5", style="--")
    ax.text(1.6, 2.5, "round 1", ha="center", va="bottom", fontsize=13)
    # B arrives: A's agent sees a node waiting and stops its healthy worker.
    ax.text(4.35, 2.5, "B joins", ha="center", va="bottom", fontsize=13, color="#d62828")
    ax.plot([4.35, 4.35], [-0.1, 2.4], color="#d62828", linestyle="--", lw=1.5)
    ax.text(
        4.35,
        1.1,
        "A's agent stops\nits healthy worker:\nnot a failure",
        ha="center",
        va="center",
        fontsize=10.5,
        color="#d62828",
        bbox={"facecolor": "white", "edgecolor": "none"},
    )
    ax.text(7.1, 2.5, "round 2", ha="center", va="bottom", fontsize=13)
    for p in join.table:
        y = lanes[join.node_of(p)]
        text = f"RANK {p.rank}, GROUP_RANK {p.group_rank}\nWORLD_SIZE {p.world_size}"
        _box(ax, 5.5, y, 3.2, 0.9, text, RANK_COLOURS[(p.rank + 1) % len(RANK_COLOURS)], fontsize=11)
    counts = ", ".join(str(c) for c in join.restarts)
    verdict = "none used up" if max(join.restarts, default=0) == 0 else "used up"
    ax.text(
        4.35,
        -0.35,
        f"restart count on every process after the join: [{counts}]; --max-restarts={launch.max_restarts}: {verdict}",
        ha="center",
        va="top",
        fontsize=12,
    )
    ax.set(xlim=(-1.4, 8.9), ylim=(-0.8, 2.9), aspect="equal")
    ax.axis("off")


def elastic_figure(join: ElasticJoin, launch: Launch) -> Figure:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    fig.suptitle(f"An elastic job grows: node B joins node A's running job (--nnodes={launch.nnodes})", fontsize=14)
    draw_elastic(fig.subplots(), join, launch)
    return fig


def describe_elastic(join: ElasticJoin, launch: Launch, nodes: bool = True) -> str:
    """The text alternative. ``nodes=False`` leaves out which node each worker of the second round
    ran on: the rendezvous orders the nodes by host and launcher pid, so on one host that is
    usually, not always, A first (the plain text strict nbval compares)."""
    if nodes:
        second = "; ".join(
            f"node {join.node_of(p)}: RANK {p.rank}, GROUP_RANK {p.group_rank}, WORLD_SIZE {p.world_size}"
            for p in join.table
        )
    else:
        second = "; ".join(f"RANK {p.rank}, GROUP_RANK {p.group_rank}, WORLD_SIZE {p.world_size}" for p in join.table)
    return (
        f"Round 1: node A alone, WORLD_SIZE {join.first_world_size}, restart count {join.first_restarts}, waiting. "
        f"Node B joins; A's agent stops its healthy worker. Round 2: {second}. Restart count on every process: "
        f"{join.restarts}, with --max-restarts={launch.max_restarts}."
    )
