"""Chapter 11: memory per rank by layout and model size, sliders over ``transformer_memory``:
``draw`` makes the figure, ``summary`` the same numbers as aligned lines. Context parallelism (cp),
experts (E, top-k, capacity factor C) and expert parallelism (ep) apply to every layout."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from .. import memory
from .. import transformer_memory as tm
from .base import Explorer

RANKS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
TP_DEGREES = [1, 2, 4, 8]
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
CP_DEGREES = [1, 2, 4, 8, 16, 32]
EXPERTS = [("dense MLP", 0), ("8", 8), ("16", 16), ("64", 64), ("128", 128)]
EP_DEGREES = [1, 2, 4, 8, 16, 32, 64, 128]
CAPACITY_FACTORS = [1.0, 1.25, 1.5, 2.0]
PART_COLORS = {"model states": "#4c72b0", "activations": "#dd8452", "buffers": "#55a868"}
DEFAULTS = dict(
    shape="GPT-3 6.7B shape (32 x 4096)",
    world_size=64,
    tp=8,
    seq_len=2048,
    micro_batch=4,
    checkpointing=False,
    cp=1,
    experts=0,
    top_k=2,
    capacity_factor=1.25,
    ep=1,
)


def _moe(experts, top_k, capacity_factor):
    return tm.MoE(experts, top_k, capacity_factor) if experts else None


def _breakdowns(shape, world_size, tp, seq_len, micro_batch, checkpointing, cp, experts, top_k, capacity_factor, ep):
    s, moe = tm.SHAPES[shape], _moe(experts, top_k, capacity_factor)
    return {
        layout: tm.per_rank_bytes(s, layout, world_size, tp, seq_len, micro_batch, checkpointing, cp=cp, ep=ep, moe=moe)
        for layout in tm.LAYOUTS
    }


def _model_line(shape, experts, top_k, capacity_factor) -> str:
    """The model's size; with experts, also the parameters one token goes through."""
    p = tm.parameters(tm.SHAPES[shape], _moe(experts, top_k, capacity_factor))
    total = sum(p.values())
    if not experts:
        return f"{shape}: {total / 1e9:.2f} B parameters (untied head)"
    active = total - p["experts"] + p["experts"] * top_k / experts
    return (
        f"{shape}, {experts} experts per block, top-{top_k}, capacity factor {capacity_factor:g}: "
        f"{total / 1e9:.2f} B parameters, {active / 1e9:.2f} B per token"
    )


def summary(
    shape,
    world_size,
    tp,
    seq_len,
    micro_batch,
    checkpointing,
    cp=1,
    experts=0,
    top_k=2,
    capacity_factor=1.25,
    ep=1,
    gpu_gb=80.0,
) -> str:
    """Per-rank memory of every layout, as aligned lines (GB = 10^9 bytes)."""
    settings = (shape, world_size, tp, seq_len, micro_batch, checkpointing, cp, experts, top_k, capacity_factor, ep)
    lines = [
        _model_line(shape, experts, top_k, capacity_factor),
        f"N = {world_size}, t = {tp}, cp = {cp}, ep = {ep}, sequence {seq_len} ({seq_len // cp} positions per rank), "
        f"micro-batch {micro_batch}" + (", every block checkpointed" if checkpointing else ""),
        f"  {'layout':7} {'model states':>13} {'activations':>12} {'buffers':>10} {'per rank':>10}"
        f"  global batch   fits {gpu_gb:g} GB?",
    ]
    for layout, parts in _breakdowns(*settings).items():
        total = sum(parts.values())
        replicas = (world_size if layout in ("ddp", "fsdp") else world_size // tp) // cp
        fits = "yes" if total <= gpu_gb * memory.GB else "no"
        lines.append(
            f"  {layout:7} {parts['model states'] / memory.GB:10.1f} GB {parts['activations'] / memory.GB:9.1f} GB"
            f" {parts['buffers'] / memory.GB:7.2f} GB {total / memory.GB:7.1f} GB"
            f"  {micro_batch * replicas:>12}   {fits}"
        )
    lines.append("  (formulas, not a measurement: mixed-precision Adam; buffers: one layer's ring attention K/V blocks")
    lines.append("   or experts' all-to-all; no logits, FSDP's gathered weights, other buffers or fragmentation)")
    return "\n".join(lines)


def draw(
    shape,
    world_size,
    tp,
    seq_len,
    micro_batch,
    checkpointing,
    cp=1,
    experts=0,
    top_k=2,
    capacity_factor=1.25,
    ep=1,
    gpu_gb=80.0,
) -> Figure:
    """Stacked bars: model states, activations and buffers per rank, one bar per layout."""
    settings = (shape, world_size, tp, seq_len, micro_batch, checkpointing, cp, experts, top_k, capacity_factor, ep)
    breakdowns = _breakdowns(*settings)
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
    title = f"{shape.split(' (')[0]}, N = {world_size}, t = {tp}, s = {seq_len}, b = {micro_batch}"
    title += f", cp = {cp}" if cp > 1 else ""
    title += f", {experts} experts (top-{top_k}, C = {capacity_factor:g}), ep = {ep}" if experts else ""
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


class LayoutMemoryExplorer(Explorer):
    """A model shape, N, the tensor-parallel degree, the sequence length, the micro-batch,
    checkpointing, the context-parallel degree, experts (top-k, capacity factor) and the
    expert-parallel degree -> the memory per rank of every layout, as a figure and aligned lines."""

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
                "cp": widgets.SelectionSlider(
                    options=CP_DEGREES, value=values["cp"], description="context parallel cp", **common
                ),
                "experts": widgets.Dropdown(
                    options=EXPERTS, value=values["experts"], description="experts E", style=style, layout=layout
                ),
                "top_k": widgets.IntSlider(value=values["top_k"], min=1, max=4, description="top-k", **common),
                "capacity_factor": widgets.SelectionSlider(
                    options=CAPACITY_FACTORS, value=values["capacity_factor"], description="capacity factor C", **common
                ),
                "ep": widgets.SelectionSlider(
                    options=EP_DEGREES, value=values["ep"], description="expert parallel ep", **common
                ),
            }
        )

    def _update(self, change=None) -> None:
        # A control that before_update moves calls back here: the update under way draws once.
        if not getattr(self, "_adjusting", False):
            super()._update(change)

    def before_update(self) -> None:
        self._adjusting = True
        try:
            self._adjust()
        finally:
            self._adjusting = False

    def _adjust(self) -> None:
        # Each degree must divide what it splits (all powers of two): the largest allowed degree
        # not above the one asked for. t divides N; cp and ep the N/t data ranks; ep the experts.
        c = self.controls
        if c["tp"].value > c["world_size"].value:
            c["tp"].value = max(t for t in TP_DEGREES if t <= c["world_size"].value)
        data_ranks = c["world_size"].value // c["tp"].value
        if c["cp"].value > data_ranks:
            c["cp"].value = max(d for d in CP_DEGREES if d <= data_ranks)
        experts = c["experts"].value
        if c["ep"].value > min(data_ranks, max(experts, 1)):
            c["ep"].value = max(d for d in EP_DEGREES if d <= min(data_ranks, max(experts, 1)))
        for name in ("top_k", "capacity_factor", "ep"):
            c[name].disabled = not experts

    def summary(self) -> str:
        return summary(**self.values)

    def figure(self) -> Figure:
        return draw(**self.values)

    def __repr__(self) -> str:
        return settings_text(self.values)


def settings_text(v: dict) -> str:
    """The explorer's repr: its settings, short (ipywidgets cuts a repr at 110 characters); cp and
    the experts only where they are used, so that a dense run's reads as it did before them."""
    extra = f", cp={v['cp']}" if v["cp"] > 1 else ""
    if v["experts"]:
        extra += f", ep={v['ep']}, E={v['experts']}, k={v['top_k']}, C={v['capacity_factor']:g}"
    return (
        f"LayoutMemoryExplorer(N={v['world_size']}, t={v['tp']}, s={v['seq_len']}, b={v['micro_batch']}, "
        f"checkpointing={v['checkpointing']}{extra})"
    )


def layout_memory_explorer(**settings) -> LayoutMemoryExplorer:
    """Memory per rank of a GPT-shaped model in every layout; settings as ``DEFAULTS``."""
    return LayoutMemoryExplorer(**settings)
