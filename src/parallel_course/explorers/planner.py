"""Chapter 14a: a layout's memory per GPU, step time, tokens/s and MFU, controls over
``planner.plan``. The data-parallel degree is what the GPUs leave: dp = GPUs / (tp x pp x cp);
the other keys of a layout keep the planner's defaults (FlashAttention, sequence parallelism,
loss-parallel logits, ZeRO-2/3 reducing every micro-batch)."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from .. import planner as P
from .base import Explorer

NODES = [1, 2, 4, 8, 16, 32, 64, 128]
TP_DEGREES = [1, 2, 4, 8]
PP_DEGREES = [1, 2, 4, 8, 16]
INTERLEAVES = [1, 2, 4]
CP_DEGREES = [1, 2, 4, 8]
BATCHES = [64, 128, 256, 512, 1024, 2048, 4096]
MEMORY_COLORS = {
    "weights": "#4c72b0",
    "gradients": "#64b5cd",
    "optimizer": "#8c8c8c",
    "activations": "#dd8452",
    "logits": "#8172b3",
    "buffers": "#55a868",
}
TIME_COLORS = {"compute": "#4c72b0", "exposed communication": "#c44e52", "bubble": "#937860"}
DEFAULTS = dict(
    model="gpt3-6.7b",
    cluster="a100-80gb",
    nodes=8,
    global_batch=512,
    tp=4,
    pp=1,
    interleave=1,
    cp=1,
    zero=1,
    micro_batch=2,
    recompute="none",
)


def layout_of(nodes, cluster, tp, pp, interleave, cp, zero, micro_batch, recompute, **_) -> P.Layout:
    """The layout on all the cluster's GPUs: dp is what tp x pp x cp leave (at least 1)."""
    gpus = P.CLUSTERS[cluster].gpus_per_node * nodes
    dp = max(gpus // (tp * pp * cp), 1)
    return P.Layout(dp, tp, pp, cp, 1, zero, micro_batch, recompute, interleave)


def plan_of(model, cluster, nodes, global_batch, **layout) -> P.Plan:
    """``planner.plan`` for the explorer's settings."""
    lay = layout_of(nodes, cluster, **layout)
    return P.plan(P.model(model), P.cluster(cluster, nodes), lay, global_batch)


def summary(**settings) -> str:
    """The plan as lines, with what it rejects if it does not fit."""
    return plan_of(**settings).summary()


def draw(**settings) -> Figure:
    """Left: memory per GPU by part against the GPU's memory; right: the step split into compute,
    exposed communication and the pipeline's bubble."""
    p = plan_of(**settings)
    fig = Figure(figsize=(8, 2.6), dpi=80)
    mem_ax, time_ax = fig.subplots(1, 2, width_ratios=[1, 2])
    bottom = 0.0
    for part, color in MEMORY_COLORS.items():
        gb = p.memory.get(part, 0.0) / P.GB
        mem_ax.bar(["per GPU"], [gb], bottom=bottom, color=color, label=part)
        bottom += gb
    mem_ax.axhline(p.cluster.memory_bytes / P.GB, color="black", linestyle="--", linewidth=1)
    mem_ax.axhline(p.usable * p.cluster.memory_bytes / P.GB, color="black", linestyle=":", linewidth=1)
    mem_ax.set_ylabel("GB")
    mem_ax.set_title("memory" + ("" if p.fits else " (rejected)"), fontsize=10)
    mem_ax.legend(fontsize=6, loc="upper left")
    left = 0.0
    parts = {"compute": p.compute_s, "exposed communication": p.exposed_comm_s, "bubble": p.bubble_s}
    for part, color in TIME_COLORS.items():
        seconds = parts[part] if p.runs else 0.0
        time_ax.barh(["step"], [seconds], left=left, color=color, label=part)
        left += seconds
    time_ax.set_xlabel("seconds per step (predicted)")
    title = f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.0%}" if p.runs else "cannot run"
    time_ax.set_title(title, fontsize=10)
    time_ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


class PlannerExplorer(Explorer):
    """Model and cluster presets, nodes, global batch, tp, pp, interleave, cp, ZeRO stage,
    micro-batch and recomputation -> ``planner.plan``: memory per GPU by part, step time split,
    tokens/s, MFU, and why a layout is rejected and what would make it fit."""

    draws = True

    def __init__(self, **settings):
        values = DEFAULTS | settings
        style, layout = {"description_width": "150px"}, widgets.Layout(width="460px")
        common = dict(style=style, layout=layout, continuous_update=False)
        drop = dict(style=style, layout=layout)
        super().__init__(
            {
                "model": widgets.Dropdown(options=list(P.MODELS), value=values["model"], description="model", **drop),
                "cluster": widgets.Dropdown(
                    options=list(P.CLUSTERS), value=values["cluster"], description="cluster", **drop
                ),
                "nodes": widgets.SelectionSlider(
                    options=NODES, value=values["nodes"], description="nodes (8 GPUs)", **common
                ),
                "global_batch": widgets.SelectionSlider(
                    options=BATCHES, value=values["global_batch"], description="global batch", **common
                ),
                "tp": widgets.SelectionSlider(
                    options=TP_DEGREES, value=values["tp"], description="tensor parallel tp", **common
                ),
                "pp": widgets.SelectionSlider(
                    options=PP_DEGREES, value=values["pp"], description="pipeline stages pp", **common
                ),
                "interleave": widgets.SelectionSlider(
                    options=INTERLEAVES, value=values["interleave"], description="chunks per stage v", **common
                ),
                "cp": widgets.SelectionSlider(
                    options=CP_DEGREES, value=values["cp"], description="context parallel cp", **common
                ),
                "zero": widgets.IntSlider(value=values["zero"], min=0, max=3, description="ZeRO stage", **common),
                "micro_batch": widgets.SelectionSlider(
                    options=[1, 2, 4, 8, 16], value=values["micro_batch"], description="micro-batch b", **common
                ),
                "recompute": widgets.Dropdown(
                    options=list(P.RECOMPUTE), value=values["recompute"], description="recompute", **drop
                ),
            }
        )

    def summary(self) -> str:
        return summary(**self.values)

    def figure(self) -> Figure:
        return draw(**self.values)

    def __repr__(self) -> str:  # short: ipywidgets cuts a repr at 110 characters
        v = self.values
        return f"PlannerExplorer({v['model']}, {v['cluster']} x {v['nodes']}, B={v['global_batch']}, {layout_of(**v)})"


def planner_explorer(**settings) -> PlannerExplorer:
    """A layout's predicted memory, step time and MFU; settings as ``DEFAULTS``."""
    return PlannerExplorer(**settings)
