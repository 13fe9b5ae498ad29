"""Chapter 11c's figures, drawn from its own computation: the micro-batches of one global batch with
the answer tokens each counts, and the weight each token gets in the step's loss when every summed
loss is divided by the global count and when the micro-batches' means are averaged (the targets the
chapter computes its gradients from); and the chapter's jobs that stop at a checkpoint and continue
in another layout, on one timeline (their ``metrics.json``; the timeline is chapter 09's).

``micro_batch_view`` and ``job_row``/``chain`` compute what is drawn where; the ``draw_`` functions
only place it on Axes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .collective_figures import RANK_COLOURS
from .fault_tolerance_figures import TimelineRow


@dataclass
class MicroBatchView:
    """The targets of each micro-batch (a list of rows of token ids, ``None`` where the target is
    ignored), the answer tokens each counts, and the weight one of its tokens gets in the step's
    loss: ``1 / N`` (each summed loss over the global count N) or ``1 / (K n_i)`` (the mean of the
    K micro-batches' means)."""

    targets: list[list[list[int | None]]]
    counts: list[int]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def global_weights(self) -> list[float]:
        return [1 / self.total for _ in self.counts]

    @property
    def mean_of_means_weights(self) -> list[float]:
        return [1 / (len(self.counts) * n) for n in self.counts]


def micro_batch_view(targets: list[torch.Tensor], ignore: int) -> MicroBatchView:
    """What ``draw_micro_batches`` draws, from each micro-batch's targets (``ignore`` where the
    loss skips the position)."""
    rows = [[[None if int(t) == ignore else int(t) for t in row] for row in y] for y in targets]
    return MicroBatchView(rows, [int((y != ignore).sum()) for y in targets])


def draw_micro_batches(ax, view: MicroBatchView) -> None:
    """Every problem of the global batch as a row of target positions, grouped by micro-batch: the
    answer tokens in the micro-batch's colour with their digit, the ignored positions blank; the
    count of each micro-batch beside it."""
    y = 0
    width = max(len(r) for mb in view.targets for r in mb)
    for i, rows in enumerate(view.targets):
        colour = RANK_COLOURS[i % len(RANK_COLOURS)]
        top = y
        for row in rows:
            for t, target in enumerate(row):
                counted = target is not None
                face = colour if counted else "#f1f3f5"
                ax.add_patch(Rectangle((t, -y - 1), 1, 1, facecolor=face, edgecolor="white", linewidth=1.5))
                if counted:
                    ax.text(t + 0.5, -y - 0.5, str(target), ha="center", va="center", fontsize=12)
            y += 1
        ax.text(width + 0.3, -(top + y) / 2, f"micro-batch {i + 1}:\n{view.counts[i]} tokens", va="center", fontsize=14)
        y += 0.4
    ax.set(xlim=(0, width + 3.4), ylim=(-y, 0.2))
    ax.set_title("each problem's answer tokens (the loss's targets)", fontsize=14)
    ax.set_xlabel("position in the sequence", fontsize=13)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)


def draw_token_weights(ax, view: MicroBatchView) -> None:
    """The weight one token of each micro-batch gets in the step's loss, times N, under each rule:
    all 1 when each summed loss is divided by the global count; N / (K n_i) for the mean of means."""
    k = len(view.counts)
    xs = range(k)
    right = [w * view.total for w in view.global_weights]
    wrong = [w * view.total for w in view.mean_of_means_weights]
    colours = [RANK_COLOURS[i % len(RANK_COLOURS)] for i in xs]
    ax.bar([x - 0.2 for x in xs], right, 0.4, color=colours, edgecolor="black", label="sum / global count N")
    ax.bar([x + 0.2 for x in xs], wrong, 0.4, color=colours, edgecolor="black", hatch="xx", label="mean of means")
    ax.axhline(1, color="black", linewidth=1)
    ax.set_xticks(list(xs), [f"{i + 1}\n{n} tokens" for i, n in enumerate(view.counts)], fontsize=13)
    ax.set_xlabel("micro-batch", fontsize=13)
    ax.set_ylabel("weight of one token × N", fontsize=13)
    ax.tick_params(axis="y", labelsize=12)
    ax.set_ylim(0, max(wrong + right) * 1.25)
    ax.set_title("each token's weight in the step's loss", fontsize=14)
    ax.legend(fontsize=13, loc="upper right")


def describe_micro_batches(view: MicroBatchView) -> str:
    """The text alternative of ``draw_micro_batches`` and ``draw_token_weights``."""
    k, n = len(view.counts), view.total
    return (
        f"{sum(len(mb) for mb in view.targets)} problems in {k} micro-batches counting "
        f"{', '.join(map(str, view.counts))} answer tokens, {n} in all. Each summed loss over the global "
        f"count gives every token the weight 1/{n}; the mean of the micro-batches' means gives a token of "
        "micro-batch i the weight 1/(K n_i): "
        + ", ".join(f"{w * n:.2f}/{n}" for w in view.mean_of_means_weights)
        + ", more for the tokens of a micro-batch with fewer."
    )


def layout_name(metrics: dict) -> str:
    """How the chapter names a run's layout: ``fsdp on 2``, or ``one process``."""
    return "one process" if metrics["world_size"] == 1 else f"{metrics['parallel']} on {metrics['world_size']}"


def job_row(metrics: dict, label: str | None = None) -> TimelineRow:
    """One job as its ``metrics.json`` reports it: the steps it ran (after ``start_step``, up to
    ``steps``) and the steps it saved."""
    return TimelineRow(
        label or layout_name(metrics),
        metrics["start_step"] + 1,
        metrics["steps"],
        checkpoints=[c["step"] for c in metrics["checkpoints"]],
    )


def checkpoint_steps(folder: Path) -> list[int]:
    """The steps of the complete checkpoints in ``folder`` (``step-NNNNNN`` folders that hold DCP's
    ``.metadata``, which a save writes last)."""
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*") if (p / ".metadata").exists())


def seed_row(label: str, folder: Path) -> TimelineRow:
    """A job that ran no step and saved a checkpoint (a seed checkpoint: step 0), from its folder."""
    return TimelineRow(label, 1, 0, checkpoints=checkpoint_steps(folder))


def chain(rows: list[TimelineRow], resumed: dict[int, int]) -> list[TimelineRow]:
    """Mark each row ``i`` of ``resumed`` as continued from row ``resumed[i]``'s checkpoint of the
    step before its first. Raises ValueError if that row saved no such checkpoint."""
    for i, source in resumed.items():
        step = rows[i].first - 1
        if step not in rows[source].checkpoints:
            raise ValueError(
                f"{rows[i].label} starts after step {step}; {rows[source].label} saved {rows[source].checkpoints}"
            )
        rows[i].resumed_from = (source, step)
    return rows


def micro_batches_figure(view: MicroBatchView) -> Figure:
    """``draw_micro_batches`` and ``draw_token_weights`` side by side."""
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    grid, weights = fig.subplots(1, 2, width_ratios=[1, 1])
    draw_micro_batches(grid, view)
    draw_token_weights(weights, view)
    return fig


@dataclass
class SavedTensor:
    """One tensor of a DCP checkpoint: its shape, and the pieces it was saved in, each as its rows,
    its columns (``(0, 1)`` for a vector) and the rank whose file holds it (``__R_0.distcp``)."""

    name: str
    shape: tuple[int, ...]
    pieces: list[tuple[tuple[int, int], tuple[int, int], int]]


def saved_tensors(metadata, names: list[str]) -> list[SavedTensor]:
    """The pieces of each tensor ``names`` lists, as a checkpoint's metadata records them
    (``FileSystemReader(folder).read_metadata()``: every saved piece's offsets and sizes, and the
    file that holds it)."""
    files = {(index.fqn, tuple(index.offset)): info.relative_path for index, info in metadata.storage_data.items()}
    found = []
    for name in names:
        meta = metadata.state_dict_metadata[name]
        pieces = []
        for chunk in meta.chunks:
            offsets, sizes = list(chunk.offsets), list(chunk.sizes)
            rows = (offsets[0], offsets[0] + sizes[0])
            columns = (offsets[1], offsets[1] + sizes[1]) if len(sizes) > 1 else (0, 1)
            writer = int(files[(name, tuple(offsets))].split("_")[2])
            pieces.append((rows, columns, writer))
        found.append(SavedTensor(name, tuple(meta.size), sorted(pieces)))
    return found


def draw_saved_tensors(ax, title: str, tensors: list[SavedTensor]) -> None:
    """A bar per tensor, its rows from left to right (its columns from bottom to top): each piece
    the checkpoint saved coloured by the rank whose file holds it, outlined."""
    n = len(tensors)
    for i, t in enumerate(tensors):
        y = n - 1 - i
        columns = t.shape[1] if len(t.shape) > 1 else 1
        for (r0, r1), (c0, c1), writer in t.pieces:
            ax.add_patch(
                Rectangle(
                    (r0 / t.shape[0], y - 0.35 + 0.7 * c0 / columns),
                    (r1 - r0) / t.shape[0],
                    0.7 * (c1 - c0) / columns,
                    facecolor=RANK_COLOURS[writer % len(RANK_COLOURS)],
                    edgecolor="black",
                    linewidth=1.2,
                )
            )
    ax.set_yticks(
        range(n), [f"{t.name.removeprefix('model.')} {list(t.shape)}" for t in reversed(tensors)], fontsize=11
    )
    ax.set(xlim=(0, 1), ylim=(-0.6, n - 0.4))
    ax.set_xticks([0, 0.5, 1], ["0", "half", "all"], fontsize=11)
    ax.set_xlabel("rows (dimension 0)", fontsize=11)
    ax.set_title(title, fontsize=13)


def saved_tensors_figure(panels: list[tuple[str, list[SavedTensor]]]) -> Figure:
    """``draw_saved_tensors`` for each (title, tensors) side by side, with the key of the ranks."""
    fig = Figure(figsize=(12, 1.4 + 0.42 * max(len(t) for _, t in panels)), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True)
    for ax, (title, tensors) in zip(axes, panels):
        draw_saved_tensors(ax, title, tensors)
    writers = sorted({w for _, tensors in panels for t in tensors for *_, w in t.pieces})
    handles = [
        Patch(facecolor=RANK_COLOURS[w % len(RANK_COLOURS)], edgecolor="black", label=f"in rank {w}'s file")
        for w in writers
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=12, frameon=False)
    return fig


def describe_saved_tensors(title: str, tensors: list[SavedTensor]) -> str:
    """The text alternative of ``draw_saved_tensors``."""
    parts = []
    for t in tensors:
        pieces = ", ".join(f"rows {r0}-{r1 - 1} by rank {w}" for (r0, r1), _, w in t.pieces)
        parts.append(f"{t.name.removeprefix('model.')} {list(t.shape)}: {pieces}")
    return f"{title}: " + "; ".join(parts) + "."
