"""Chapter 01: sliders over the cost model (``costmodel.predict``), its prediction, and the
predicted speedup against N for both algorithms."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .. import costmodel
from .base import Explorer

GBIT = 1e9 / 8  # bytes per second in one Gbit/s
MB = 1e6  # bytes


class CostModelExplorer(Explorer):
    """Sliders for the chapter-01 cost model, its prediction, and speedup against N."""

    draws = True
    N_MAX = 64  # the plot's x-axis: 1 .. N_MAX workers

    def __init__(
        self,
        world_size: int = 8,
        compute_ms: float = 100.0,
        model_mb: float = 100.0,
        bandwidth_gbit: float = 10.0,
        latency_us: float = 50.0,
        overlap: float = 0.0,
        algorithm: str = "ring",
    ):
        style = {"description_width": "190px"}
        layout = widgets.Layout(width="520px")
        common = dict(style=style, layout=layout, continuous_update=False)
        super().__init__(
            {
                "world_size": widgets.IntSlider(
                    value=world_size, min=1, max=self.N_MAX, description="workers N", **common
                ),
                "compute_ms": widgets.FloatLogSlider(
                    value=compute_ms,
                    base=10,
                    min=0,
                    max=4,
                    step=0.05,
                    description="compute per step (ms)",
                    readout_format=".3g",
                    **common,
                ),
                "model_mb": widgets.FloatLogSlider(
                    value=model_mb,
                    base=10,
                    min=0,
                    max=4,
                    step=0.05,
                    description="gradient size S (MB)",
                    readout_format=".3g",
                    **common,
                ),
                "bandwidth_gbit": widgets.FloatLogSlider(
                    value=bandwidth_gbit,
                    base=10,
                    min=0,
                    max=3.5,
                    step=0.05,
                    description="link bandwidth (Gbit/s)",
                    readout_format=".3g",
                    **common,
                ),
                "latency_us": widgets.FloatSlider(
                    value=latency_us,
                    min=0,
                    max=1000,
                    step=5,
                    description="latency per message (µs)",
                    readout_format=".0f",
                    **common,
                ),
                "overlap": widgets.FloatSlider(
                    value=overlap,
                    min=0,
                    max=1,
                    step=0.05,
                    description="overlap with compute",
                    readout_format=".2f",
                    **common,
                ),
                "algorithm": widgets.ToggleButtons(
                    value=algorithm,
                    options=[("ring all-reduce", "ring"), ("parameter server", "ps")],
                    description="algorithm",
                    style=style,
                ),
            }
        )

    # --- the model, in the units costmodel wants -------------------------------------------

    def config(self) -> dict:
        """The current settings as keyword arguments of ``costmodel.predict`` (SI units)."""
        v = self.values
        return dict(
            compute_s=v["compute_ms"] / 1e3,
            model_bytes=v["model_mb"] * MB,
            bandwidth=v["bandwidth_gbit"] * GBIT,
            latency=v["latency_us"] / 1e6,
            overlap=v["overlap"],
            algorithm=v["algorithm"],
        )

    def prediction(self) -> costmodel.StepPrediction:
        return costmodel.predict(self.controls["world_size"].value, **self.config())

    def summary(self) -> str:
        """The prediction for the current settings, rounded for display."""
        p = self.prediction()
        t = costmodel.traffic(self.config()["algorithm"], p.world_size, self.config()["model_bytes"])
        lines = [
            f"N = {p.world_size} workers, {self.controls['algorithm'].label}",
            f"each worker sends     {t.worker_sends / MB:9.1f} MB per step",
            f"the server receives   {t.server_receives / MB:9.1f} MB per step",
            f"compute               {p.compute_s * 1e3:9.1f} ms",
            f"communication         {p.comm_s * 1e3:9.1f} ms",
            f"  of it hidden        {p.hidden_s * 1e3:9.1f} ms",
            f"predicted step        {p.step_s * 1e3:9.1f} ms",
            f"speedup (throughput)  {p.speedup:9.2f}  (ideal: {p.world_size})",
            f"efficiency            {p.efficiency:9.0%}",
        ]
        if self.config()["algorithm"] == "ring":
            lines.pop(2)
        return "\n".join(lines)

    def figure(self) -> Figure:
        """Speedup against N for both algorithms at the current settings."""
        config = self.config()
        ns = list(range(1, self.N_MAX + 1))
        fig = Figure(figsize=(4.6, 3.2), dpi=90)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.plot(ns, ns, color="0.6", linestyle=":", label="ideal (N)")
        for algorithm, label in [("ring", "ring all-reduce"), ("ps", "parameter server")]:
            curve = costmodel.scaling(ns, **{**config, "algorithm": algorithm})
            chosen = algorithm == config["algorithm"]
            ax.plot(
                ns, [p.speedup for p in curve], label=label, linewidth=2 if chosen else 1, alpha=1 if chosen else 0.5
            )
        p = self.prediction()
        ax.plot([p.world_size], [p.speedup], "o", color="black")
        ax.set_xlabel("workers N")
        ax.set_ylabel("predicted speedup (throughput)")
        ax.set_title("cost-model prediction, not a measurement", fontsize=10)
        ax.set_xlim(1, self.N_MAX)
        top = max(max(line.get_ydata()[-1] for line in ax.get_lines()[1:]), 4)
        ax.set_ylim(0, min(self.N_MAX, 1.25 * top))
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        return fig

    def __repr__(self) -> str:
        # What a notebook stores as the cell's text: the settings, not the PNG bytes.
        # (ipywidgets cuts it at 110 characters: keep it short.)
        v = self.values
        return (
            f"CostModelExplorer(N={v['world_size']}, {v['algorithm']}, "
            f"compute_ms={v['compute_ms']:g}, model_mb={v['model_mb']:g}, "
            f"bandwidth_gbit={v['bandwidth_gbit']:g}, latency_us={v['latency_us']:g}, "
            f"overlap={v['overlap']:g})"
        )


def cost_model_explorer(**defaults) -> CostModelExplorer:
    """An explorer of ``costmodel.predict``: sliders, the predicted step, speedup against N.

    Keyword arguments set the starting values (``world_size``, ``compute_ms``, ``model_mb``,
    ``bandwidth_gbit``, ``latency_us``, ``overlap``, ``algorithm``).
    """
    return CostModelExplorer(**defaults)
