"""Chapter 11: memory per rank by layout and model size, sliders over ``transformer_memory``:
``draw`` makes the figure, ``summary`` the same numbers as aligned lines."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from .. import memory
from .. import transformer_memory as tm
from .base import Explorer

RANKS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
TP_DEGREES = [1, 2, 4, 8]
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
PART_COLORS = {"model states": "#4c72b0", "activations": "#dd8452"}
DEFAULTS = dict(
    shape="GPT-3 6.7B shape (32 x 4096)", world_size=64, tp=8, seq_len=2048, micro_batch=4, checkpointing=False
)


def _breakdowns(shape, world_size, tp, seq_len, micro_batch, checkpointing):
    s = tm.SHAPES[shape]
    return {
        layout: tm.per_rank_bytes(s, layout, world_size, tp, seq_len, micro_batch, checkpointing)
        for layout in tm.LAYOUTS
    }


def summary(shape, world_size, tp, seq_len, micro_batch, checkpointing, gpu_gb=80.0) -> str:
    """Per-rank memory of every layout, as aligned lines (GB = 10^9 bytes)."""
    s = tm.SHAPES[shape]
    total_params = sum(tm.parameters(s).values())
    lines = [
        f"{shape}: {total_params / 1e9:.2f} B parameters (untied head), N = {world_size}, t = {tp}, "
        f"sequence {seq_len}, micro-batch {micro_batch}" + (", every block checkpointed" if checkpointing else ""),
        f"  {'layout':7} {'model states':>13} {'activations':>12} {'per rank':>10}  global batch   fits {gpu_gb:g} GB?",
    ]
    for layout, parts in _breakdowns(shape, world_size, tp, seq_len, micro_batch, checkpointing).items():
        total = sum(parts.values())
        replicas = world_size if layout in ("ddp", "fsdp") else world_size // tp
        fits = "yes" if total <= gpu_gb * memory.GB else "no"
        lines.append(
            f"  {layout:7} {parts['model states'] / memory.GB:10.1f} GB {parts['activations'] / memory.GB:9.1f} GB"
            f" {total / memory.GB:7.1f} GB  {micro_batch * replicas:>12}   {fits}"
        )
    lines.append("  (formulas, not a measurement: mixed-precision Adam; no logits, buffers or fragmentation)")
    return "\n".join(lines)


def draw(shape, world_size, tp, seq_len, micro_batch, checkpointing, gpu_gb=80.0) -> Figure:
    """Stacked bars: model states and activations per rank, one bar per layout."""
    breakdowns = _breakdowns(shape, world_size, tp, seq_len, micro_batch, checkpointing)
    fig = Figure(figsize=(8, 3.6), dpi=80)
    ax = fig.subplots()
    bottoms = [0.0] * len(breakdowns)
    for part, color in PART_COLORS.items():
        heights = [b[part] / memory.GB for b in breakdowns.values()]
        ax.bar(list(breakdowns), heights, bottom=bottoms, color=color, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, total in enumerate(bottoms):
        ax.annotate(f"{total:.0f}" if total >= 10 else f"{total:.2g}", (i, total), ha="center", va="bottom", fontsize=8)
    ax.axhline(gpu_gb, color="black", linestyle="--", linewidth=1, label=f"{gpu_gb:g} GB device")
    ax.set_ylabel("GB per rank")
    ax.set_title(f"{shape.split(' (')[0]}, N = {world_size}, t = {tp}, s = {seq_len}, b = {micro_batch}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


class LayoutMemoryExplorer(Explorer):
    """A model shape, N, the tensor-parallel degree, the sequence length, the micro-batch and
    checkpointing -> the memory per rank of every layout, as a figure and aligned lines."""

    draws = True

    def __init__(self, **settings):
        values = DEFAULTS | settings
        style, layout = {"description_width": "150px"}, widgets.Layout(width="460px")
        common = dict(style=style, layout=layout, continuous_update=False)
        super().__init__(
            {
                "shape": widgets.Dropdown(
                    options=list(tm.SHAPES), value=values["shape"], description="model", style=style, layout=layout
                ),
                "world_size": widgets.SelectionSlider(
                    options=RANKS, value=values["world_size"], description="processes N", **common
                ),
                "tp": widgets.SelectionSlider(
                    options=TP_DEGREES, value=values["tp"], description="tensor parallel t", **common
                ),
                "seq_len": widgets.SelectionSlider(
                    options=SEQ_LENS, value=values["seq_len"], description="sequence length", **common
                ),
                "micro_batch": widgets.IntSlider(
                    value=values["micro_batch"], min=1, max=16, description="micro-batch b", **common
                ),
                "checkpointing": widgets.Checkbox(value=values["checkpointing"], description="checkpoint every block"),
            }
        )

    def before_update(self) -> None:
        # t must divide N: the largest allowed degree not above the one asked for
        if self.controls["tp"].value > self.controls["world_size"].value:
            self.controls["tp"].value = max(t for t in TP_DEGREES if t <= self.controls["world_size"].value)

    def summary(self) -> str:
        return summary(**self.values)

    def figure(self) -> Figure:
        return draw(**self.values)

    def __repr__(self) -> str:
        v = self.values
        return (
            f"LayoutMemoryExplorer(N={v['world_size']}, t={v['tp']}, s={v['seq_len']}, b={v['micro_batch']}, "
            f"checkpointing={v['checkpointing']})"
        )


def layout_memory_explorer(**settings) -> LayoutMemoryExplorer:
    """Memory per rank of a GPT-shaped model in every layout; settings as ``DEFAULTS``."""
    return LayoutMemoryExplorer(**settings)
