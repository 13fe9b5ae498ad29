"""Chapter 08's figures, drawn from its own computation: what each rank keeps at rest under DDP and
ZeRO-1/2/3 (``memory.per_rank_breakdown``, the formulas the chapter checks against the ZeRO paper),
and which of a model's parameters one rank holds at each moment of an FSDP2 step (the chapter's
model's own tensor shapes, cut as ``fully_shard`` cuts them).

``rest_layout`` and ``fsdp_timeline`` compute what is drawn where; the ``draw_`` functions only
place it on Axes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from matplotlib.patches import Patch, Rectangle

from . import memory

PARTS = ("weights", "gradients", "optimizer states")
PART_COLOURS = {"weights": "tab:blue", "gradients": "tab:orange", "optimizer states": "tab:green"}


@dataclass
class Held:
    """What a rank keeps of one part: the fraction [start, stop) of the whole, and its bytes."""

    part: str
    start: float
    stop: float
    nbytes: float


def rest_layout(n_params: float, world_size: int, stage: str, precision_name: str = "mixed") -> list[list[Held]]:
    """Per rank, per part, the slice of the whole it keeps at rest and its bytes: a part the stage
    shards is rank r's r-th 1/N, a part it does not is whole (``memory.per_rank_breakdown``)."""
    mine = memory.per_rank_breakdown(n_params, world_size, stage, precision_name)
    whole = memory.per_rank_breakdown(n_params, 1, stage, precision_name)
    layout = []
    for rank in range(world_size):
        held = []
        for part in PARTS:
            share = mine[part] / whole[part] if whole[part] else 0.0
            sharded = share < 1.0
            start = rank * share if sharded else 0.0
            held.append(Held(part, start, start + share, mine[part]))
        layout.append(held)
    return layout


def draw_rest(ax, layout: list[list[Held]], bytes_per_param: dict[str, int], title: str) -> None:
    """One stage: per rank a box per part, as wide as its bytes per parameter and as tall as the
    whole part, filled where this rank keeps it (its own 1/N slice, or all of it)."""
    gap = 1.5
    width = sum(bytes_per_param[p] for p in PARTS) * 0.1 + 0.2 * (len(PARTS) - 1)
    for rank, held in enumerate(layout):
        x = rank * (width + gap)
        for h in held:
            w = bytes_per_param[h.part] * 0.1
            ax.add_patch(Rectangle((x, 0), w, 1, fill=False, edgecolor="0.6", linewidth=0.8))
            ax.add_patch(Rectangle((x, 1 - h.stop), w, h.stop - h.start, color=PART_COLOURS[h.part]))
            x += w + 0.2
        ax.text(rank * (width + gap) + width / 2, -0.08, f"rank {rank}", ha="center", va="top", fontsize=11)
    ax.set_title(title, fontsize=12, loc="left")
    # A margin on the right, apart from the stage beside it.
    ax.set(xlim=(-0.1, len(layout) * (width + gap) - gap + 1.2), ylim=(-0.3, 1.02))
    ax.axis("off")


def shard_rows(rows: int, world_size: int) -> list[int]:
    """Rows of a dimension-0 shard on each rank, as FSDP2 cuts a tensor (``torch.chunk``: pieces
    of ceil(rows / N), the last ones shorter or empty)."""
    size = -(-rows // world_size)
    return [max(0, min(size, rows - r * size)) for r in range(world_size)]


def shard_numel(shapes: list[tuple[int, ...]], world_size: int, rank: int) -> int:
    """Elements of ``shapes`` that ``rank`` keeps when each is sharded on dimension 0."""
    total = 0
    for shape in shapes:
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += shard_rows(shape[0], world_size)[rank] * rest
    return total


@dataclass
class Moment:
    """One moment of a step: its name and, per unit, whether the rank holds its shard or the
    whole (gathered) weights, and the parameters it holds then."""

    name: str
    gathered: dict[str, bool]
    held: int


def fsdp_timeline(units: dict[str, list[tuple[int, ...]]], blocks: list[str], world_size: int, rank: int = 0):
    """What ``rank`` holds of each unit at each moment of one step under FSDP2's defaults
    (``fully_shard`` on each block, then on the root): at rest every unit is a shard; the root
    (``units``' key not in ``blocks``) is gathered when forward starts and kept to the end of
    backward; each block is gathered for its forward, freed after, gathered again for its backward
    (in reverse order), then freed and its gradient reduce-scattered."""
    root = [u for u in units if u not in blocks]
    if len(root) != 1:
        raise ValueError(f"expected one root unit besides the blocks, got {root}")
    shard = {u: shard_numel(s, world_size, rank) for u, s in units.items()}
    full = {u: shard_numel(s, 1, 0) for u, s in units.items()}

    def moment(name, gathered_units):
        gathered = {u: u in gathered_units for u in units}
        return Moment(name, gathered, sum(full[u] if gathered[u] else shard[u] for u in units))

    moments = [moment("at rest", set())]
    moments += [moment(f"forward\n{b}", {root[0], b}) for b in blocks]
    moments += [moment(f"backward\n{b}", {root[0], b}) for b in reversed(blocks)]
    moments.append(moment("after\nbackward", set()))
    return moments


def draw_timeline(ax, moments: list[Moment], units: list[str], rank: int, world_size: int) -> None:
    """A row per unit, a column per moment: dark where the rank holds the whole gathered weights,
    light where only its shard; the parameters held at each moment written under the column."""
    for j, m in enumerate(moments):
        for i, u in enumerate(units):
            y = len(units) - 1 - i
            whole = m.gathered[u]
            ax.add_patch(
                Rectangle(
                    (j, y), 0.9, 0.8, facecolor="tab:blue" if whole else "#dbe9f6", edgecolor="0.5", linewidth=0.6
                )
            )
            ax.text(
                j + 0.45,
                y + 0.4,
                "whole" if whole else f"1/{world_size}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if whole else "0.3",
            )
        ax.text(j + 0.45, -0.15, m.name, ha="center", va="top", fontsize=8)
        ax.text(j + 0.45, -0.85, f"{m.held:,}", ha="center", va="top", fontsize=8, color="tab:red")
    for i, u in enumerate(units):
        ax.text(-0.1, len(units) - 1 - i + 0.4, u, ha="right", va="center", fontsize=9)
    ax.text(-0.1, -1.0, "parameters held", ha="right", va="center", fontsize=8, color="tab:red")
    ax.set(xlim=(-2.2, len(moments)), ylim=(-1.4, len(units)))
    ax.axis("off")


# "   0 |     35,523 |     142,092 | ...": a rank's row of c08_fsdp.py's storage table.
STORAGE_ROW = re.compile(r"^\s*(\d+) \|\s+([\d,]+) \|", re.M)


def stored_parameters(output: str) -> list[int]:
    """The parameters each rank stored, in rank order, from ``c08_fsdp.py``'s printed table."""
    rows = [(int(rank), int(count.replace(",", ""))) for rank, count in STORAGE_ROW.findall(output)]
    if [rank for rank, _ in rows] != list(range(len(rows))) or not rows:
        raise ValueError("no storage table with one row per rank, in rank order, in the output")
    return [count for _, count in rows]


def timeline_figure(fig, moments: list[Moment], units: list[str], rank: int, world_size: int) -> None:
    """``draw_timeline`` on ``fig``, with a key."""
    ax = fig.subplots()
    draw_timeline(ax, moments, units, rank, world_size)
    fig.legend(
        handles=[
            Patch(facecolor="tab:blue", label="whole weights, all-gathered for this moment"),
            Patch(facecolor="#dbe9f6", edgecolor="0.5", label=f"only this rank's shard, 1/{world_size}"),
        ],
        loc="outside lower center",
        ncol=2,
        fontsize=10,
        frameon=False,
    )


def rest_figure(fig, n_params: float, world_size: int, precision_name: str = "mixed") -> None:
    """Every stage's ``rest_layout`` on ``fig``, one row per stage, with its bytes per rank."""
    per_param = memory.bytes_per_parameter(precision_name)
    # Two stages to a row: wide rather than tall, to fill a slide.
    for ax, stage in zip(fig.subplots(2, 2).flat, memory.STAGES):
        layout = rest_layout(n_params, world_size, stage, precision_name)
        per_rank = sum(h.nbytes for h in layout[0]) / memory.GB
        draw_rest(ax, layout, per_param, f"{stage}: {per_rank:.1f} GB per rank")
    fig.legend(
        handles=[Patch(color=PART_COLOURS[p], label=f"{p}: {per_param[p]} bytes per parameter") for p in PARTS],
        loc="outside lower center",
        ncol=3,
        fontsize=11,
    )


def describe_rest(n_params: float, world_size: int, precision_name: str = "mixed") -> str:
    """The text alternative of ``rest_figure``."""
    parts = []
    for stage in memory.STAGES:
        layout = rest_layout(n_params, world_size, stage, precision_name)
        kept = ", ".join(f"{'all' if h.stop - h.start == 1 else f'1/{world_size}'} of the {h.part}" for h in layout[0])
        parts.append(f"{stage}: each rank keeps {kept}, {sum(h.nbytes for h in layout[0]) / memory.GB:.1f} GB.")
    return f"What each of {world_size} ranks keeps at rest, {n_params / 1e9:g} B parameters. " + " ".join(parts)


def describe_timeline(moments: list[Moment], rank: int, world_size: int) -> str:
    """The text alternative of ``timeline_figure``."""
    parts = [
        f"{m.name.replace(chr(10), ' ')}: whole {', '.join(u for u, g in m.gathered.items() if g) or 'nothing'}, "
        f"{m.held:,} parameters"
        for m in moments
    ]
    return f"Rank {rank} of {world_size} under FSDP2, moment by moment: " + "; ".join(parts) + "."
