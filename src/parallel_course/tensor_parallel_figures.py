"""Chapter 07b's figure, drawn from its own run: a linear layer's weight split column-wise and
row-wise over the ranks, what each rank computes with its shard, and the collectives that put
the output back together, all read from what ``c07_tensor_parallel.py`` printed (the DTensor's
placement and local shard shape, and the collectives ``CommDebugMode`` counted in each pass).

``parse_tp_run`` reads the output, ``layer_splits`` computes what is drawn where (each rank's
block of the weight and of the output); the ``draw_`` functions only place it on Axes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .collective_figures import RANK_COLOURS, REDUCED_COLOUR

# "2 ranks, backend=gloo device=cpu"
RANKS_LINE = re.compile(r"^(\d+) ranks, backend=")
# "column-parallel: weight (32, 16) as a DTensor, placement Shard(dim=0), local shard (16, 16); bias placement ..."
WEIGHT_LINE = re.compile(
    r"^(.+?): weight \((\d+), (\d+)\) as a DTensor, placement Shard\(dim=(\d)\), "
    r"local shard \((\d+), (\d+)\); bias placement (.+)$"
)
# "column-parallel: forward ran 1 all_gather, backward 1 all_reduce"
COMM_LINE = re.compile(r"^(.+?): forward ran (.+), backward (.+)$")


def _counts(text: str) -> dict[str, int]:
    # "1 all_gather, 2 all_reduce" or "no collective"
    if text.strip() == "no collective":
        return {}
    counts = {}
    for part in text.split(", "):
        n, name = part.split(" ", 1)
        counts[name] = int(n)
    return counts


@dataclass
class TPRun:
    """What the run printed: its ranks, each split layer's weight (shape, sharded dim, rank 0's
    local shard, the bias's placement), and the collectives of each module's forward and backward."""

    ranks: int
    weights: dict[str, tuple[tuple[int, int], int, tuple[int, int], str]]
    comms: dict[str, tuple[dict[str, int], dict[str, int]]]


def parse_tp_run(output: str) -> TPRun:
    """The ranks, the weights and the collective counts from ``c07_tensor_parallel.py``'s output."""
    ranks, weights, comms = None, {}, {}
    for line in output.splitlines():
        if m := RANKS_LINE.match(line):
            ranks = int(m.group(1))
        elif m := WEIGHT_LINE.match(line):
            name, out_f, in_f, dim, l0, l1, bias = m.groups()
            weights[name] = ((int(out_f), int(in_f)), int(dim), (int(l0), int(l1)), bias.strip())
        elif m := COMM_LINE.match(line):
            comms[m.group(1)] = (_counts(m.group(2)), _counts(m.group(3)))
    if ranks is None:
        raise ValueError("no 'N ranks, backend=...' line: not c07_tensor_parallel.py's output")
    return TPRun(ranks, weights, comms)


def chunk_sizes(size: int, ranks: int) -> list[int]:
    """How DTensor's ``Shard`` cuts ``size`` over the ranks (``torch.chunk``: pieces of
    ceil(size / N), the last ones shorter or empty)."""
    piece = -(-size // ranks)
    return [max(0, min(piece, size - r * piece)) for r in range(ranks)]


@dataclass
class RankShard:
    """One rank's block of the weight, rows [row0, row1) x columns [col0, col1) of W (out, in),
    and what it computes: output features [out0, out1), whole (a slice) or partial (a sum's term)."""

    rank: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    out: tuple[int, int]
    partial: bool


@dataclass
class LayerSplit:
    """One split layer as the run left it: the weight's shape, the dimension it is cut on, each
    rank's block, and the collectives of its forward and backward."""

    name: str
    shape: tuple[int, int]
    dim: int
    shards: list[RankShard]
    bias: str
    forward: dict[str, int]
    backward: dict[str, int]

    @property
    def style(self) -> str:
        # As the chapter says it: column-parallel keeps a block of W's rows (W is (out, in)).
        return "rows (output features)" if self.dim == 0 else "columns (input features)"


def layer_splits(run: TPRun) -> list[LayerSplit]:
    """Per layer the run split, each rank's block of W and of the output. Shard(0) cuts W's rows
    (output features): rank r computes its slice of the output, whole. Shard(1) cuts W's columns
    (input features): rank r computes every output feature, but only its inputs' part of the sum.
    Rank 0's printed local shard must match that cut."""
    splits = []
    for name, (shape, dim, local, bias) in run.weights.items():
        sizes = chunk_sizes(shape[dim], run.ranks)
        expected = (sizes[0], shape[1]) if dim == 0 else (shape[0], sizes[0])
        if local != expected:
            raise ValueError(f"{name}: rank 0's local shard {local} is not Shard({dim}) of {shape} over {run.ranks}")
        shards, start = [], 0
        for r, size in enumerate(sizes):
            cut = (start, start + size)
            if dim == 0:
                shards.append(RankShard(r, cut, (0, shape[1]), cut, partial=False))
            else:
                shards.append(RankShard(r, (0, shape[0]), cut, (0, shape[0]), partial=True))
            start += size
        forward, backward = run.comms.get(name, ({}, {}))
        splits.append(LayerSplit(name, shape, dim, shards, bias, forward, backward))
    return splits


def computes(shard: RankShard, out_features: int) -> str:
    """What a rank computes with its block: x times its rows (plus its slice of b), or its slice
    of x times its columns (b is added once, after the sum)."""
    r = shard.rank
    if shard.partial:
        return f"x[:, {shard.cols[0]}:{shard.cols[1]}] · W{r}ᵀ = a partial sum of all {out_features}"
    return f"x · W{r}ᵀ + b{r} = features {shard.out[0]}:{shard.out[1]}"


def _names(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items())) or "no collective"


# What a forward collective does to the ranks' outputs.
JOINS = {"all_gather": "slices put side by side", "all_reduce": "partial outputs summed"}


def draw_split(ax, split: LayerSplit) -> None:
    """One layer: W (out x in) with each rank's block in its colour; beside it, per rank, the
    output it computes (its slice, or a partial sum over all features, hatched); below, the
    forward collective the run counted, and the whole output every rank then holds."""
    out_f, in_f = split.shape
    # W drawn 3 units tall, from y = 2 to 5; its width in proportion.
    s, top = 3.0 / out_f, 5.0
    for sh in split.shards:
        colour = RANK_COLOURS[sh.rank % len(RANK_COLOURS)]
        x0, y0 = sh.cols[0] * s, top - sh.rows[1] * s
        w, h = (sh.cols[1] - sh.cols[0]) * s, (sh.rows[1] - sh.rows[0]) * s
        ax.add_patch(Rectangle((x0, y0), w, h, facecolor=colour, edgecolor="black", linewidth=1))
        ax.text(
            x0 + w / 2,
            y0 + h / 2,
            f"rank {sh.rank}\n{sh.rows[1] - sh.rows[0]}×{sh.cols[1] - sh.cols[0]}",
            ha="center",
            va="center",
            fontsize=11,
        )
    ax.text(in_f * s / 2, top + 0.12, f"W: {out_f} × {in_f}", ha="center", va="bottom", fontsize=11)
    ax.text(in_f * s / 2, top - 3.12, f"Shard(dim={split.dim})", ha="center", va="top", fontsize=11)
    # Per rank, the output it computes: a bar of the out features.
    n = len(split.shards)
    bx, bw = in_f * s + 0.7, 3.0
    for sh in split.shards:
        y = top - (sh.rank + 0.5) * 3.0 / n - 0.25
        colour = RANK_COLOURS[sh.rank % len(RANK_COLOURS)]
        ax.add_patch(Rectangle((bx, y - 0.15), bw, 0.3, fill=False, edgecolor="0.5", linewidth=0.8))
        x = bx + sh.out[0] / out_f * bw
        width = (sh.out[1] - sh.out[0]) / out_f * bw
        hatch = "//" if sh.partial else None
        ax.add_patch(Rectangle((x, y - 0.15), width, 0.3, facecolor=colour, edgecolor="black", hatch=hatch))
        ax.text(bx, y + 0.22, f"rank {sh.rank}: {computes(sh, out_f)}", ha="left", va="bottom", fontsize=10.5)
    ax.text(bx + bw / 2, top + 0.12, "what each rank computes", ha="center", va="bottom", fontsize=11)
    # Down: the collective, and what every rank holds after it.
    ax.annotate("", xy=(bx + bw / 2, 0.95), xytext=(bx + bw / 2, 1.85), arrowprops={"arrowstyle": "-|>", "lw": 1.8})
    joins = ", ".join(JOINS.get(name, name) for name in sorted(split.forward))
    ax.text(bx + bw / 2 + 0.15, 1.55, _names(split.forward), ha="left", va="center", fontsize=12, fontweight="bold")
    ax.text(bx + bw / 2 + 0.15, 1.2, joins, ha="left", va="center", fontsize=10.5)
    if any(sh.partial for sh in split.shards):
        ax.add_patch(Rectangle((bx, 0.5), bw, 0.3, facecolor=REDUCED_COLOUR, edgecolor="black"))
    else:
        for sh in split.shards:
            colour = RANK_COLOURS[sh.rank % len(RANK_COLOURS)]
            x = bx + sh.out[0] / out_f * bw
            width = (sh.out[1] - sh.out[0]) / out_f * bw
            ax.add_patch(Rectangle((x, 0.5), width, 0.3, facecolor=colour, edgecolor="black"))
    bias = " (+ b, once)" if any(sh.partial for sh in split.shards) else ""
    ax.text(bx - 0.15, 0.65, f"every rank: all {out_f}{bias}", ha="right", va="center", fontsize=10.5)
    ax.text(
        bx + bw / 2,
        0.3,
        f"backward: {_names(split.backward)} (the input's gradient)",
        ha="center",
        va="top",
        fontsize=10.5,
        color="0.25",
    )
    ax.set_title(f"{split.name}: each rank keeps\na block of W's {split.style}; bias {split.bias}", fontsize=12.5)
    # Kept to the bottom of its space when the equal aspect shrinks it: its title clear of the figure's.
    ax.set(xlim=(-1.9, bx + bw + 0.3), ylim=(-0.3, top + 0.45), aspect="equal", anchor="S")
    ax.axis("off")


def tp_figure(run: TPRun) -> Figure:
    """Each split layer of the run side by side, and a key to the colours."""
    splits = layer_splits(run)
    fig = Figure(figsize=(6.5 * len(splits), 5.6), layout="constrained")
    title = f"A linear layer split over {run.ranks} ranks, as c07_tensor_parallel.py ran it"
    # The modules the run counted without printing a weight (the MLP): one line each.
    others = [
        f"{name}: forward {_names(f)}, backward {_names(b)}"
        for name, (f, b) in run.comms.items()
        if name not in run.weights
    ]
    fig.suptitle(title, fontsize=13.5)
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    for ax, split in zip(axes, splits):
        draw_split(ax, split)
    handles = [
        Patch(facecolor=RANK_COLOURS[r % len(RANK_COLOURS)], edgecolor="black", label=f"rank {r}")
        for r in range(run.ranks)
    ]
    handles.append(
        Patch(facecolor="white", edgecolor="black", hatch="//", label="a partial sum (misses the other ranks' terms)")
    )
    handles.append(Patch(facecolor=REDUCED_COLOUR, edgecolor="black", label="summed over all ranks"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=len(handles),
        fontsize=11,
        frameon=False,
        title="\n".join(others) or None,
        title_fontsize=12,
    )
    return fig


def describe_tp(run: TPRun) -> str:
    """The figure's text alternative: per layer, each rank's block of W, what it computes, and the
    collectives of each pass."""
    parts = [f"A linear layer split over {run.ranks} ranks."]
    for split in layer_splits(run):
        out_f, in_f = split.shape
        ranks = "; ".join(
            f"rank {sh.rank} keeps rows {sh.rows[0]}-{sh.rows[1] - 1} and columns {sh.cols[0]}-{sh.cols[1] - 1} "
            + (
                "and computes a partial sum of all output features"
                if sh.partial
                else f"and computes output features {sh.out[0]}-{sh.out[1] - 1}"
            )
            for sh in split.shards
        )
        parts.append(
            f"{split.name}: W of {out_f} by {in_f} cut by {split.style}: {ranks}. "
            f"Forward runs {_names(split.forward)}, backward {_names(split.backward)}."
        )
    return " ".join(parts)
