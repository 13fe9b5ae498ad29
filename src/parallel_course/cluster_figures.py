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
    return Launch(
        found["nnodes"], int(found["nproc_per_node"]), found["rdzv_backend"], found["rdzv_endpoint"], found["rdzv_id"]
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
        4.2,
        store_w,
        1.0,
        f"{launch.rdzv_backend} rendezvous store\nat {launch.rdzv_endpoint}, id {launch.rdzv_id}",
        "#e9ecef",
        fontsize=11,
    )
    for k, node in enumerate(nodes):
        x0 = k * (node_w + 1.0)
        _box(ax, x0, 0, node_w, 2.9, "", "#f8f9fa", edge="0.4")
        ax.text(x0 + node_w / 2, 2.65, f"node: GROUP_RANK {node.group_rank}", ha="center", va="center", fontsize=12)
        ax.text(
            x0 + node_w / 2,
            2.3,
            f"torchrun --nnodes={launch.nnodes} --nproc_per_node={launch.nproc_per_node}",
            ha="center",
            va="center",
            fontsize=9,
            family="monospace",
        )
        for j, p in enumerate(node.processes):
            px = x0 + gap + j * (pw + gap)
            text = f"RANK {p.rank}\nLOCAL_RANK {p.local_rank}\n= {rank_formula(p, launch.nproc_per_node)}"
            _box(ax, px, 0.2, pw, 1.7, text, RANK_COLOURS[p.rank % len(RANK_COLOURS)], fontsize=10)
        # Join, then be told the node's number.
        cx = x0 + node_w / 2
        sx_mid = sx + store_w * (0.3 + 0.4 * k / max(n - 1, 1))
        ax.annotate(
            "", xy=(sx_mid - 0.15, 4.2), xytext=(cx - 0.15, 2.9), arrowprops={"arrowstyle": "-|>", "color": "0.3"}
        )
        ax.annotate(
            "", xy=(cx + 0.15, 2.9), xytext=(sx_mid + 0.15, 4.2), arrowprops={"arrowstyle": "-|>", "color": "#d62828"}
        )
        ax.text(
            (cx + sx_mid) / 2 + (0.35 if k else -0.35),
            3.55,
            f"joins; gets\nGROUP_RANK {node.group_rank}",
            ha="left" if k else "right",
            va="center",
            fontsize=9.5,
            color="#d62828",
        )
    world = nodes[0].processes[0].world_size
    ax.text(
        total / 2,
        -0.35,
        f"WORLD_SIZE = {n} nodes × {launch.nproc_per_node} processes = {world};  "
        f"RANK = GROUP_RANK × {launch.nproc_per_node} + LOCAL_RANK",
        ha="center",
        va="top",
        fontsize=11,
    )
    ax.set(xlim=(-0.3, total + 0.3), ylim=(-0.9, 5.4), aspect="equal")
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
    fig = Figure(figsize=(11, 5.2), layout="constrained")
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
