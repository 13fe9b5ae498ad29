"""Throughput of a training run and its model FLOPs utilisation (MFU), measured on this machine
(chapter 14a; the matrix-product peak as chapter 06a measures it).

MFU is the rate of *model* FLOPs a run achieves (the FLOPs the model needs per token, times tokens
per second; recomputation by activation checkpointing not counted) over the hardware's peak: PaLM's
definition (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", section 4.1 and
appendix B). Here the peak is not a data sheet's but measured: the fastest of many float32 products
of two 512 x 512 matrices, 2 n^3 FLOPs each, on the threads this process computes with.

Rates are also written as times (ms per GFLOP, µs per token): a notebook prints them that way, as
06a does, so that its stored output compares across machines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median

import torch


@dataclass(frozen=True)
class MatmulPeak:
    """The fastest of ``repeats`` products of two n x n float32 matrices on ``threads`` threads."""

    n: int
    repeats: int
    threads: int
    best_s: float

    @property
    def flops(self) -> float:
        """FLOPs of one product: n^2 outputs, each n multiplies and n adds."""
        return 2.0 * self.n**3

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.best_s


def measure_matmul_peak(n: int | None = None, repeats: int = 60, device: torch.device | str = "cpu") -> MatmulPeak:
    """This process's float32 matrix-product peak on ``device``: the least disturbed of ``repeats``
    timed products (06a's cell: a capacity, so the minimum, not the median), after one warm-up, on
    a CPU with the threads torch computes with now (one per process in the course's launches).
    About 0.2 s at the defaults on one core. On a GPU each product is timed to its end
    (synchronized); a GPU needs products far larger than 512 to approach its peak, and its
    data-sheet peak is for 16-bit tensor cores, not float32. n: 512 on a CPU (06a's), 4096 on a GPU."""
    device = torch.device(device)
    n = (4096 if device.type == "cuda" else 512) if n is None else n
    if n < 1 or repeats < 1:
        raise ValueError(f"n and repeats must be at least 1, got {n} and {repeats}")
    # Seeded on a generator of its own: the caller's random state is left as it was.
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(device) for _ in range(2))

    def wait() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Warm-up: the first product allocates and picks its kernel.
    a @ b
    wait()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        wait()
        best = min(best, time.perf_counter() - start)
    return MatmulPeak(n=n, repeats=repeats, threads=torch.get_num_threads(), best_s=best)


def median_step_s(step_times_s: list[float], skip: int = 1) -> float:
    """The median step time without the first ``skip`` steps (the first pays for warm-ups: kernel
    choice, allocator, DDP's first bucket rebuild)."""
    kept = list(step_times_s)[skip:]
    if not kept:
        raise ValueError(f"no step left after skipping {skip} of {len(step_times_s)}: train more steps")
    return median(kept)


def achieved_flops_per_s(flops_per_token: float, tokens_per_step: int, step_s: float) -> float:
    """Model FLOPs per second of the whole job: FLOPs per token x tokens per step / step time."""
    if step_s <= 0:
        raise ValueError(f"a step time must be positive, got {step_s}")
    return flops_per_token * tokens_per_step / step_s


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of every device of the job
    (PaLM, Chowdhery et al. 2022, section 4.1)."""
    if peak_flops_per_s <= 0:
        raise ValueError(f"a peak must be positive, got {peak_flops_per_s}")
    return achieved_flops_per_s / peak_flops_per_s


def summary(
    tokens_per_step: int,
    step_times_s: list[float],
    flops_per_token: float,
    peaks_flops_per_s: list[float] | None = None,
) -> dict:
    """A run's throughput figures (what train_gpt.py writes to metrics.json): tokens per step, the
    median step time after the first, tokens/s and model FLOP/s of the whole job; with the peaks
    of its processes (one each), their sum and the MFU against it. A run of one step is timed by it."""
    # The first step pays for the warm-ups; a run of one step has only that one.
    skip = 1 if len(step_times_s) > 1 else 0
    step_s = median_step_s(step_times_s, skip)
    achieved = achieved_flops_per_s(flops_per_token, tokens_per_step, step_s)
    figures = {
        "tokens_per_step": tokens_per_step,
        "step_times_s": list(step_times_s),
        "steps_timed": len(step_times_s) - skip,
        "median_step_s": step_s,
        "tokens_per_s": tokens_per_step / step_s,
        "model_flops_per_token": flops_per_token,
        "model_flops_per_s": achieved,
    }
    if peaks_flops_per_s:
        figures["peak_flops_per_s_per_process"] = list(peaks_flops_per_s)
        figures["peak_flops_per_s"] = sum(peaks_flops_per_s)
        figures["mfu"] = mfu(achieved, figures["peak_flops_per_s"])
    return figures


def ms_per_gflop(flops_per_s: float) -> float:
    """A rate written as a time, as 06a prints it: milliseconds per 10^9 FLOPs (GFLOP/s = 1000 / that)."""
    return 1e3 / (flops_per_s / 1e9)


def describe(figures: dict) -> str:
    """One line for a log: every rate written as a time (µs per token, ms per GFLOP) and the MFU
    as a ratio, so that only the measured numbers differ between two runs of the same command."""
    after = ", after the first" if figures["steps_timed"] < len(figures["step_times_s"]) else ""
    line = (
        f"throughput: {figures['tokens_per_step']} tokens per step, median step "
        f"{1e3 * figures['median_step_s']:.2f} ms ({figures['steps_timed']} timed{after}): "
        f"{1e6 / figures['tokens_per_s']:.2f} µs per token; model FLOPs {figures['model_flops_per_token'] / 1e6:.3f} "
        f"MFLOP per token, achieved {ms_per_gflop(figures['model_flops_per_s']):.2f} ms per GFLOP"
    )
    if "mfu" in figures:
        processes = len(figures["peak_flops_per_s_per_process"])
        line += (
            f"; measured matmul peak of {'1 process' if processes == 1 else f'{processes} processes together'} "
            f"{ms_per_gflop(figures['peak_flops_per_s']):.3f} ms per GFLOP: MFU {figures['mfu']:.3f}x"
        )
    return line
