"""Plots of the benchmarks' JSON (chapters 06a, 06b): thin layers on ``bandwidth`` and ``scaling``."""

from __future__ import annotations

from .bandwidth import busbw, fit_alpha_beta
from .scaling import scaling_rows


def plot_bandwidth(report: dict, ax=None):
    """busbw against message size for each implementation in a bench_allreduce JSON, with the α–β fit."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    n = report["world_size"]
    for i, (impl, data) in enumerate(report["impls"].items()):
        sizes = [r["bytes"] for r in data["sizes"]]
        bw = [r["busbw_bytes_per_s"] / 1e9 for r in data["sizes"]]
        label = {"torch": f"dist.all_reduce ({report['backend']})", "ring": "course ring (lab 03)"}.get(impl, impl)
        ax.plot(sizes, bw, "o", color=f"C{i}", label=f"{label}: measured")
        if n > 1 and len(sizes) >= 2:
            fit = fit_alpha_beta(sizes, [r["time_s"] for r in data["sizes"]], n)
            fine = [sizes[0] * (sizes[-1] / sizes[0]) ** (k / 100) for k in range(101)]
            ax.plot(
                fine,
                [busbw(s, fit.predict_s(s), n) / 1e9 for s in fine],
                "-",
                color=f"C{i}",
                label=f"α–β fit: α = {fit.alpha_s * 1e6:.0f} µs, β = {fit.beta_bytes_per_s / 1e9:.2f} GB/s",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all_reduce, {n} ranks, {report['backend']} on {report['device']} (median of {report['iters']})")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return ax


def _plot_speedup_and_efficiency(axes, report: dict) -> None:
    """Speedup over one process (with the linear line) and efficiency, one line per model."""
    models = list(report["models"])
    for i, model in enumerate(models):
        rows = scaling_rows(report, model)
        ddp = [(n, r) for label, n, r in rows if label == "DDP"]
        ns = [n for n, _ in ddp]
        axes[0].plot(ns, [r["speedup"] for _, r in ddp], "o-", color=f"C{i}", label=f"{model}: DDP")
        axes[1].plot(ns, [r["speedup"] / n for n, r in ddp], "o-", color=f"C{i}", label=model)
        for label, n, r in rows:
            if label == "DataParallel":
                axes[0].plot([n], [r["speedup"]], "s", color=f"C{i}", label=f"{model}: DataParallel")
    top = max(max(n for _, n, _ in scaling_rows(report, m)) for m in models)
    axes[0].plot([1, top], [1, top], ":", color="gray", label="linear")
    axes[0].set_ylabel("speedup over one process")
    axes[1].axhline(1.0, linestyle=":", color="gray")
    axes[1].set_ylabel("scaling efficiency (speedup / N)")
    for ax in axes:
        ax.set_xlabel("processes")
        ax.set_xticks(range(1, top + 1))
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("throughput relative to one process (same load)")
    axes[1].set_title("efficiency")


def _plot_step_split(ax, report: dict) -> None:
    """Each model's DDP step at the largest N: compute, communication, the step as measured."""
    labels, y = [], 0
    for model, m in report["models"].items():
        n, r = max(((int(k), v) for k, v in m["ddp"].items()), key=lambda kv: kv[0])
        if n < 2:
            continue
        # as a share of the measured step
        scale = 1 / r["step_s"]
        ax.barh(y + 0.25, r["compute_s"] * scale, height=0.4, color="C0", label="compute (no_sync)" if y == 0 else None)
        ax.barh(
            y + 0.25,
            r["comm_s"] * scale,
            left=r["compute_s"] * scale,
            height=0.4,
            color="C3",
            label="all-reduce alone" if y == 0 else None,
        )
        ax.barh(y - 0.25, 1, height=0.4, color="gray", label="DDP step (measured)" if y == 0 else None)
        labels.append(
            f"{model}, N={n}\noverlap {r['overlap']:.2f}" + (" (< 0: slower together)" if r["overlap"] < 0 else "")
        )
        y += 1
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("time relative to the DDP step (= 1)")
    ax.set_title("compute + communication vs the step")
    ax.legend(fontsize=7, loc="lower right")


def plot_scaling(report: dict):
    """Throughput and efficiency against processes, one line per model, plus each step's split."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    _plot_speedup_and_efficiency(axes[:2], report)
    _plot_step_split(axes[2], report)
    threads = report.get("threads_per_process")
    fig.suptitle(f"{report['backend']} on {report['device']}" + (f", {threads} thread per process" if threads else ""))
    fig.tight_layout()
    return fig


def describe_iterations(times_ms: list[float], device: str) -> tuple[str, str]:
    """The text alternative of a plot of one operation's timings (ms, one per iteration, with their
    median and mean), with the times; and a plain text without them (they differ from run to run)."""
    import statistics

    what = f"{len(times_ms)} timings of x @ x, 512×512, on {device}, one dot per iteration, with their median and mean"
    times = ", ".join(f"{t:.2f}" for t in times_ms)
    alt = f"{what}: {times} ms; median {statistics.median(times_ms):.2f} ms, mean {statistics.mean(times_ms):.2f} ms."
    return alt, f"{what} (the times differ from run to run)."


def describe_bandwidth(report: dict) -> tuple[str, str]:
    """The text alternative of ``plot_bandwidth``'s figure, with each size's bus bandwidth and the
    α–β fit; and a plain text without the measured numbers (they differ from machine to machine)."""
    n = report["world_size"]
    what = (
        f"Bus bandwidth of all_reduce against message size (log scale), {n} ranks, {report['backend']} on "
        f"{report['device']}, measured (dots) and the α–β fit (line), for {', '.join(report['impls'])}"
    )
    parts = []
    for impl, data in report["impls"].items():
        points = ", ".join(f"{r['bytes']} B: {r['busbw_bytes_per_s'] / 1e9:.3g} GB/s" for r in data["sizes"])
        fit = ""
        if n > 1 and len(data["sizes"]) >= 2:
            f = fit_alpha_beta([r["bytes"] for r in data["sizes"]], [r["time_s"] for r in data["sizes"]], n)
            fit = f"; fit α = {f.alpha_s * 1e6:.0f} µs, β = {f.beta_bytes_per_s / 1e9:.2f} GB/s"
        parts.append(f"{impl}: {points}{fit}")
    return f"{what}. " + ". ".join(parts) + ".", f"{what} (the numbers differ from machine to machine)."
