"""Chapters 04 and 05's figures, drawn from their own computation: which items each rank reads in
each epoch, asked of ``DistributedSampler`` itself (with and without ``set_epoch``), and DDP's
buckets in the order ``backward()`` fills them, with when each bucket's all-reduce was launched,
as chapter 05's comm hook recorded them (``c05_buckets.json``).

``sampler_epochs``/``item_readers`` and ``bucket_rows`` turn those results into what is drawn
where; the ``draw_`` functions only place it on Axes."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

RANK_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff", "#d9d9d9"]
BUCKET_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff"]

# --- 04: who reads what, epoch by epoch -----------------------------------------------------------


def sampler_epochs(
    n_items: int, num_replicas: int, epochs: int, seed: int = 0, set_epoch: bool = True
) -> list[list[list[int]]]:
    """``reads[epoch][rank]``: the indices ``DistributedSampler`` hands rank ``rank`` in that
    epoch, one sampler per rank made once (as a training script makes it) and iterated once per
    epoch, calling ``set_epoch(epoch)`` first or not."""
    from torch.utils.data.distributed import DistributedSampler

    samplers = [
        DistributedSampler(range(n_items), num_replicas=num_replicas, rank=r, shuffle=True, seed=seed)
        for r in range(num_replicas)
    ]
    reads = []
    for epoch in range(epochs):
        if set_epoch:
            for sampler in samplers:
                sampler.set_epoch(epoch)
        reads.append([list(sampler) for sampler in samplers])
    return reads


def item_readers(reads: list[list[list[int]]], n_items: int) -> list[list[list[tuple[int, int]]]]:
    """``grid[epoch][item]``: the (rank, position in that rank's epoch, from 1) of every read of
    the item: one read each, two for an item the sampler repeats to pad, none for one it drops."""
    grid = []
    for epoch in reads:
        row: list[list[tuple[int, int]]] = [[] for _ in range(n_items)]
        for rank, indices in enumerate(epoch):
            for position, item in enumerate(indices, start=1):
                row[item].append((rank, position))
        grid.append(row)
    return grid


def draw_sampler_grid(ax, grid: list[list[list[tuple[int, int]]]], title: str) -> None:
    """A row per epoch, a column per item; a cell has the colour of the rank that reads the item
    and the position at which it reads it; an item read twice (padding) is split in two."""
    epochs, n_items = len(grid), len(grid[0])
    for epoch, row in enumerate(grid):
        y = epochs - 1 - epoch
        ax.text(-0.15, y + 0.5, f"epoch {epoch}", ha="right", va="center", fontsize=14)
        for item, readers in enumerate(row):
            if not readers:
                ax.add_patch(Rectangle((item, y), 1, 1, facecolor="white", edgecolor="0.5", hatch="//"))
                continue
            width = 1 / len(readers)
            for k, (rank, position) in enumerate(readers):
                x = item + k * width
                ax.add_patch(
                    Rectangle(
                        (x, y),
                        width,
                        1,
                        facecolor=RANK_COLOURS[rank % len(RANK_COLOURS)],
                        edgecolor="black",
                        linewidth=0.6,
                    )
                )
                ax.text(x + width / 2, y + 0.5, str(position), ha="center", va="center", fontsize=12.5)
    for item in range(n_items):
        ax.text(item + 0.5, epochs + 0.1, str(item), ha="center", va="bottom", fontsize=12.5)
    ax.text(n_items / 2, epochs + 0.65, "item of the data set", ha="center", va="bottom", fontsize=12.5, color="0.3")
    ax.set_title(title, fontsize=16, family="monospace", pad=4)
    ax.set(xlim=(-1.3, n_items + 0.1), ylim=(-0.1, epochs + 1.1))
    ax.axis("off")


def sampler_figure(without: list[list[list[int]]], with_: list[list[list[int]]], n_items: int) -> Figure:
    """Without ``set_epoch`` (left) and with it (right): the same sampler, the same epochs."""
    fig = Figure(figsize=(13, 0.75 * len(without) + 2.4), layout="constrained")
    axes = fig.subplots(1, 2)
    draw_sampler_grid(axes[0], item_readers(without, n_items), "no set_epoch")
    draw_sampler_grid(axes[1], item_readers(with_, n_items), "sampler.set_epoch(epoch)")
    ranks = len(without[0])
    fig.legend(
        handles=[Patch(facecolor=RANK_COLOURS[r], edgecolor="black", label=f"read by rank {r}") for r in range(ranks)],
        loc="lower center",
        ncol=ranks + 1,
        fontsize=13,
        frameon=False,
    )
    fig.get_layout_engine().set(rect=(0, 0.09, 1, 0.91))
    fig.suptitle(
        f"DistributedSampler, {n_items} items on {ranks} ranks. Colour: the rank that reads the item;\n"
        "number: its place in that rank's epoch; a split cell: read twice (padding)",
        fontsize=15,
    )
    return fig


def _rank_sets(epoch: list[list[int]]) -> str:
    return "; ".join(f"rank {r} reads {indices}" for r, indices in enumerate(epoch))


def describe_sampler(without: list[list[list[int]]], with_: list[list[list[int]]], n_items: int) -> str:
    """The text alternative: per epoch, the indices each rank reads, without and with set_epoch."""
    parts = [
        f"DistributedSampler with {n_items} items on {len(without[0])} ranks, a row per epoch, a "
        "column per item coloured by the rank that reads it."
    ]
    for name, reads in (("Without set_epoch", without), ("With set_epoch", with_)):
        epochs = " ".join(f"Epoch {e}: {_rank_sets(epoch)}." for e, epoch in enumerate(reads))
        parts.append(f"{name}: {epochs}")
    return " ".join(parts)


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def describe_loss_curves(runs: dict[str, dict]) -> str:
    """The text alternative of chapter 04's loss curves (each run's ``metrics.json``): the runs
    whose losses agree to 4 significant digits in every epoch named together, as one curve."""
    curves: dict[tuple[str, ...], list[str]] = {}
    for name, m in runs.items():
        values = tuple(f"{loss:.4g}" for loss in m["loss"])
        curves.setdefault(values, []).append(f"{name} (global batch {m['global_batch_size']})")
    text = "; ".join(
        f"{_and(names)}: {'one curve, ' if len(names) > 1 else ''}{', '.join(values)}"
        for values, names in curves.items()
    )
    return f"Global mean MSE loss per epoch, log scale, a line per run; {len(curves)} distinct curves. {text}."


# --- 05: buckets in backward order, and when each all-reduce starts --------------------------------


@dataclass
class BucketBox:
    """One bucket: its index, its layers in the order backward() produced their gradients, the
    columns it spans, its size, and its all-reduce: launched how many-th, from and to when (ms
    after backward() started)."""

    index: int
    layers: list[str]
    first: int
    last: int
    mb: float
    tensors: int
    launched: int
    start_ms: float
    end_ms: float


@dataclass
class BucketRow:
    label: str
    backward_ms: float
    buckets: list[BucketBox]


def cap_label(cap: str) -> str:
    return "bucket_cap_mb unset (default)" if cap == "unset" else f"bucket_cap_mb={cap}"


def backward_order(timelines: dict) -> list[str]:
    """The model's layers in the order backward() produces their gradients: the last layer first."""
    layers = {layer for t in timelines.values() for b in t["buckets"] for layer in b["layers"]}
    return sorted(layers, key=int, reverse=True)


def bucket_rows(timelines: dict) -> list[BucketRow]:
    """A row per bucket cap, from the hook's record (cap -> {"backward_ms", "buckets": [{"bucket",
    "tensors", "mb", "layers", "start", "end"}]}): each bucket spans its layers' columns in
    backward order. Refuses a record where a layer is in no bucket or two, or where a bucket's
    layers are not next to one another in backward order (DDP fills buckets in that order)."""
    order = backward_order(timelines)
    column = {layer: i for i, layer in enumerate(order)}
    rows = []
    for cap, t in timelines.items():
        seen = [layer for b in t["buckets"] for layer in b["layers"]]
        if sorted(seen, key=int) != sorted(order, key=int):
            raise ValueError(f"{cap_label(cap)}: layers {seen}, expected each of {order} once")
        by_start = sorted(t["buckets"], key=lambda b: b["start"])
        boxes = []
        for b in sorted(t["buckets"], key=lambda b: b["bucket"]):
            cols = sorted(column[layer] for layer in b["layers"])
            if cols != list(range(cols[0], cols[-1] + 1)):
                raise ValueError(f"{cap_label(cap)}: bucket {b['bucket']}'s layers {b['layers']} are not adjacent")
            boxes.append(
                BucketBox(
                    index=b["bucket"],
                    layers=[order[c] for c in cols],
                    first=cols[0],
                    last=cols[-1],
                    mb=b["mb"],
                    tensors=b["tensors"],
                    launched=by_start.index(b) + 1,
                    start_ms=b["start"],
                    end_ms=b["end"],
                )
            )
        rows.append(BucketRow(cap_label(cap), t["backward_ms"], boxes))
    return rows


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def draw_buckets(ax, rows: list[BucketRow], order: list[str]) -> None:
    """A row per cap; columns are the layers in the order backward() produces their gradients;
    each bucket a box over its layers, and a flag at its right end (its last gradient) saying
    when its all-reduce was launched."""
    n, step, height = len(order), 2.1, 1.0
    top = len(rows) * step
    for i, layer in enumerate(order):
        ax.text(i + 0.5, top - 0.1, f"layer {layer}", ha="center", va="bottom", fontsize=12.5)
    ax.annotate("", xy=(n, top + 0.5), xytext=(0, top + 0.5), arrowprops={"arrowstyle": "-|>", "color": "0.3"})
    ax.text(
        n / 2,
        top + 0.6,
        "backward() produces the gradients in this order (last layer first)",
        ha="center",
        va="bottom",
        fontsize=13,
        color="0.3",
    )
    for r, row in enumerate(rows):
        y = (len(rows) - 1 - r) * step + 0.8
        ax.text(-0.15, y + height / 2, row.label, ha="right", va="center", fontsize=13, family="monospace")
        for box in row.buckets:
            ax.add_patch(
                FancyBboxPatch(
                    (box.first + 0.06, y),
                    box.last - box.first + 0.88,
                    height,
                    boxstyle="round,pad=0,rounding_size=0.08",
                    facecolor=BUCKET_COLOURS[box.index % len(BUCKET_COLOURS)],
                    edgecolor="black",
                )
            )
            ax.text(
                (box.first + box.last + 1) / 2,
                y + height / 2,
                f"bucket {box.index}\n{box.tensors} tensors\n{box.mb:.2f} MiB",
                ha="center",
                va="center",
                fontsize=12,
            )
            # The all-reduce is launched once the bucket's last gradient (its right end) is ready.
            ax.plot([box.last + 0.94] * 2, [y - 0.05, y - 0.3], color="#c1121f", linewidth=1.5)
            ax.text(
                box.last + 0.94,
                y - 0.33,
                f"{_ordinal(box.launched)} launch\nat {box.start_ms:.1f} ms",
                ha="right",
                va="top",
                fontsize=11,
                color="#c1121f",
            )
    ax.set(xlim=(-3.2, n + 0.1), ylim=(-0.15, top + 1.2))
    ax.axis("off")


def buckets_figure(timelines: dict, title: str | None = None) -> Figure:
    rows = bucket_rows(timelines)
    fig = Figure(figsize=(14, 1.7 * len(rows) + 1.6), layout="constrained")
    ax = fig.subplots()
    draw_buckets(ax, rows, backward_order(timelines))
    ax.set_title(
        title
        or "DDP's buckets as backward() fills them, and when each all-reduce was launched "
        "(rank 0, step 4; ms after backward() started)",
        fontsize=15,
    )
    return fig


def describe_buckets(timelines: dict) -> str:
    """The text alternative: per cap, each bucket's layers in backward order and its launch rank
    (the times are left out: they differ from run to run)."""
    parts = [
        "DDP's buckets over the model's layers in the order backward() produces their gradients "
        f"(layers {', '.join(backward_order(timelines))}), a row per bucket cap."
    ]
    for row in bucket_rows(timelines):
        buckets = "; ".join(
            f"bucket {b.index}, layers {', '.join(b.layers)}, {b.mb:.2f} MiB, "
            f"all-reduce launched {_ordinal(b.launched)}"
            for b in row.buckets
        )
        parts.append(f"{row.label}: {buckets}.")
    return " ".join(parts)


def _timeline_label(cap: str, bucket: dict) -> str:
    name = "cap unset" if cap == "unset" else f"cap {cap} MiB"
    return f"{name}, bucket {bucket['bucket']} (layers {','.join(bucket['layers'])})"


def timeline_figure(timelines: dict) -> Figure:
    """Each bucket's all-reduce as a bar from its launch to its completion callback, a row per
    bucket, the caps one under another; a black line where backward() returned."""
    fig = Figure(figsize=(9, 4), layout="tight")
    ax = fig.subplots()
    rows, labels, y = [], [], 0.0
    for cap, t in timelines.items():
        top = y
        for b in t["buckets"]:
            ax.barh(y, b["end"] - b["start"], left=b["start"], height=0.6, color=f"C{b['bucket']}")
            rows.append(y)
            labels.append(_timeline_label(cap, b))
            y += 1
        ax.plot([t["backward_ms"]] * 2, [top - 0.4, y - 0.6], color="black", linewidth=2)
        # A gap between runs.
        y += 0.5
    ax.set_yticks(rows, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since backward() started; black line: backward() returned")
    ax.set_title("Each bucket's all-reduce, from launch to completion (rank 0)")
    ax.set_xlim(left=0)
    return fig


def describe_timeline(timelines: dict) -> tuple[str, str]:
    """The timeline's text alternative, with each bar's times, and a plain text without them (the
    times differ from run to run; nbval compares the plain text)."""
    bars = [(_timeline_label(cap, b), b) for cap, t in timelines.items() for b in t["buckets"]]
    spans = "; ".join(f"{label}: {b['start']:.1f} to {b['end']:.1f} ms" for label, b in bars)
    alt = f"Each bucket's all-reduce from launch to completion, ms after backward() started: {spans}."
    plain = (
        "Each bucket's all-reduce from launch to completion, a bar per bucket: "
        + "; ".join(label for label, _ in bars)
        + " (the times differ from run to run)"
    )
    return alt, plain
