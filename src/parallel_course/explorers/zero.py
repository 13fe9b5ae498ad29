"""Chapter 08: a ZeRO memory calculator, sliders over ``memory.per_rank_breakdown``: ``draw``
makes the figure, ``summary`` the same numbers as aligned lines."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from .. import memory
from .base import Explorer

RANKS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
PART_COLORS = {"weights": "#4c72b0", "gradients": "#dd8452", "optimizer states": "#55a868"}


def summary(params_billion: float = 7.5, world_size: int = 64, precision: str = "mixed", gpu_gb: float = 80.0) -> str:
    """Model-state memory per rank for every stage, as aligned lines (GB = 10^9 bytes)."""
    n_params = params_billion * 1e9
    p = memory.precision(precision)
    lines = [
        f"{params_billion:g} B parameters, N = {world_size} ranks, {p.name}:",
        f"  {p.weights} + {p.gradients} + {p.optimizer} = {p.total} bytes per parameter",
        f"  {'':8} {'weights':>9} {'grads':>9} {'optim':>9} {'per rank':>10}   fits in {gpu_gb:g} GB?",
    ]
    for stage in memory.STAGES:
        parts = memory.per_rank_breakdown(n_params, world_size, stage, precision)
        total = sum(parts.values())
        fits = "yes" if total <= gpu_gb * memory.GB else "no"
        lines.append(
            f"  {stage:8} "
            + " ".join(f"{v / memory.GB:9.2f}" for v in parts.values())
            + f" {total / memory.GB:7.2f} GB   {fits}"
        )
    lines.append("  (model states only: activations, buffers and fragmentation come on top)")
    return "\n".join(lines)


def draw(params_billion: float = 7.5, world_size: int = 64, precision: str = "mixed", gpu_gb: float = 80.0) -> Figure:
    """Left: per-rank memory by part at this N. Right: per-rank memory against N, every stage."""
    n_params = params_billion * 1e9
    fig = Figure(figsize=(10, 3.6), dpi=80)
    left, right = fig.subplots(1, 2)

    bottoms = [0.0] * len(memory.STAGES)
    breakdowns = [memory.per_rank_breakdown(n_params, world_size, s, precision) for s in memory.STAGES]
    for part, color in PART_COLORS.items():
        heights = [b[part] / memory.GB for b in breakdowns]
        left.bar(memory.STAGES, heights, bottom=bottoms, color=color, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, total in enumerate(bottoms):
        left.annotate(
            f"{total:.0f}" if total >= 100 else f"{total:.3g}", (i, total), ha="center", va="bottom", fontsize=8
        )
    left.axhline(gpu_gb, color="black", linestyle="--", linewidth=1, label=f"{gpu_gb:g} GB device")
    left.set_ylabel("GB per rank (model states)")
    left.set_title(f"{params_billion:g} B parameters, N = {world_size}, {precision}", fontsize=10)
    left.legend(fontsize=8)

    for stage in memory.STAGES:
        right.plot(
            RANKS,
            [memory.per_rank_bytes(n_params, n, stage, precision) / memory.GB for n in RANKS],
            marker=".",
            label=stage,
        )
    right.axhline(gpu_gb, color="black", linestyle="--", linewidth=1)
    right.axvline(world_size, color="0.6", linestyle=":", linewidth=1)
    right.set_xscale("log", base=2)
    right.set_xticks(RANKS[::2], [str(n) for n in RANKS[::2]])
    right.set_yscale("log")
    right.set_xlabel("ranks N")
    right.set_ylabel("GB per rank")
    right.set_title("the ZeRO paper's formulas, not a measurement", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


class ZeroCalculator(Explorer):
    """Sliders for the parameter count, N, precision and device memory -> the memory per rank of
    every ZeRO stage, as a figure (``draw``) and aligned lines (``summary``)."""

    draws = True

    def __init__(
        self, params_billion: float = 7.5, world_size: int = 64, precision: str = "mixed", gpu_gb: float = 80.0
    ):
        style = {"description_width": "160px"}
        common = dict(style=style, layout=widgets.Layout(width="480px"), continuous_update=False)
        super().__init__(
            {
                "params_billion": widgets.FloatLogSlider(
                    value=params_billion,
                    base=10,
                    min=-1,
                    max=3,
                    step=0.05,
                    description="parameters (billions)",
                    readout_format=".3g",
                    **common,
                ),
                "world_size": widgets.SelectionSlider(options=RANKS, value=world_size, description="ranks N", **common),
                "precision": widgets.ToggleButtons(
                    options=[("mixed (2+2+12)", "mixed"), ("fp32 (4+4+8)", "fp32")],
                    value=precision,
                    description="precision",
                    style=style,
                ),
                "gpu_gb": widgets.FloatSlider(
                    value=gpu_gb,
                    min=8,
                    max=192,
                    step=8,
                    description="device memory (GB)",
                    readout_format=".0f",
                    **common,
                ),
            }
        )

    def summary(self) -> str:
        return summary(**self.values)

    def figure(self) -> Figure:
        return draw(**self.values)

    def __repr__(self) -> str:
        kw = self.values
        return (
            f"ZeroCalculator(params_billion={kw['params_billion']:g}, world_size={kw['world_size']}, "
            f"precision={kw['precision']!r}, gpu_gb={kw['gpu_gb']:g})"
        )


def zero_calculator(
    params_billion: float = 7.5, world_size: int = 64, precision: str = "mixed", gpu_gb: float = 80.0
) -> ZeroCalculator:
    """Sliders for the parameter count, N, precision and device memory; a figure and a table."""
    return ZeroCalculator(params_billion, world_size, precision, gpu_gb)
