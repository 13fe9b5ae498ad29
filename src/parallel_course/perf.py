"""Reading distributed benchmarks (chapter 06): bandwidths, the α–β fit, scaling, overlap.

Plain functions on numbers, lists and the JSON that ``scripts/bench_allreduce.py``,
``scripts/bench_scaling.py`` and the chapter's profiler script write; the plots at the end are
thin layers on top. The scripts themselves never import this module (they are self-contained:
``bench_allreduce.py`` carries its own copy of ``fit_alpha_beta``, and a test keeps the two equal).
Also two measurements made in the notebook's kernel: which threads compute, and what autograd
keeps for ``backward()``.

Definitions (those of nccl-tests for the bandwidths, ``doc/PERFORMANCE.md`` in NVIDIA/nccl-tests):

- ``algbw = bytes / time``: the size of the tensor over the time of one all-reduce;
- ``busbw = algbw · 2(N−1)/N``: the rate at which each rank sends (and receives) in a ring
  all-reduce, comparable with the hardware's bandwidth per direction whatever the number of ranks N;
- the α–β (Hockney) model of an all-reduce of S bytes: ``t(S) = α + (2(N−1)/N) · S / β``, α the
  fixed cost of one call, β the bus bandwidth it tends to for large messages;
- strong scaling at a fixed global batch: ``speedup = throughput_N / throughput_1``,
  ``efficiency = speedup / N`` (``bench_scaling.py`` times one process on the whole batch
  alternately with each configuration, so both see the same machine load);
- ``overlap = (t_compute + t_comm − t_step) / t_comm``: the share of the communication hidden
  behind computation (1: all of it, 0: none, < 0: the step is slower than computing and then
  communicating one after the other: the two slow each other down).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

# --- bandwidth -----------------------------------------------------------------------------------


def bus_factor(world_size: int) -> float:
    """2(N−1)/N: bytes each rank sends in a ring all-reduce, per byte of the tensor."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return 2 * (world_size - 1) / world_size


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the tensor's size over the time of one all-reduce."""
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return nbytes / seconds


def busbw(nbytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s: algbw · 2(N−1)/N (0 for one rank: nothing moves)."""
    return algbw(nbytes, seconds) * bus_factor(world_size)


@dataclass(frozen=True)
class AlphaBeta:
    """t(S) = alpha + (2(N−1)/N) · S / beta  (seconds, bytes/s)."""

    alpha_s: float
    beta_bytes_per_s: float
    world_size: int

    def predict_s(self, nbytes: float) -> float:
        return self.alpha_s + bus_factor(self.world_size) * nbytes / self.beta_bytes_per_s

    def half_bandwidth_bytes(self) -> float:
        """The message size at which half of the time is latency: S½ = α·β / (2(N−1)/N)."""
        return self.alpha_s * self.beta_bytes_per_s / bus_factor(self.world_size)


def fit_alpha_beta(sizes: list[float], times: list[float], world_size: int) -> AlphaBeta:
    """Least-squares fit of the α–β model on *relative* error (each point weighs 1/t).

    Timings span several decades (microseconds to tenths of a second); an unweighted fit would
    let the largest message decide everything and leave α meaningless. ``bench_allreduce.py``
    has the same fit (same checks, same messages), returning a dict.
    """
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("need at least two (size, time) points, as many sizes as times")
    if world_size < 2:
        raise ValueError("one rank exchanges nothing: fit the model to 2 or more ranks")
    if min(times) <= 0:
        raise ValueError("times must be positive")
    if len(set(sizes)) < 2:
        raise ValueError("need at least two different sizes")
    # minimise sum(((a + b·S − t) / t)^2): linear least squares in (a, b)
    s11 = sum(1 / t**2 for t in times)
    s12 = sum(s / t**2 for s, t in zip(sizes, times))
    s22 = sum(s * s / t**2 for s, t in zip(sizes, times))
    r1 = sum(1 / t for t in times)
    r2 = sum(s / t for s, t in zip(sizes, times))
    det = s11 * s22 - s12 * s12
    a = (r1 * s22 - r2 * s12) / det
    b = (s11 * r2 - s12 * r1) / det
    if not b > 0:
        raise ValueError("the time does not grow with the size: no bandwidth to fit")
    return AlphaBeta(alpha_s=a, beta_bytes_per_s=bus_factor(world_size) / b, world_size=world_size)


# --- timing statistics ---------------------------------------------------------------------------


def median_of_slowest(times_by_rank: list[list[float]]) -> float:
    """Median over iterations of the slowest rank's time (a collective ends when the last rank does)."""
    if not times_by_rank or not times_by_rank[0]:
        raise ValueError("need at least one rank with at least one time")
    if len({len(t) for t in times_by_rank}) != 1:
        raise ValueError("every rank must report the same number of iterations")
    return statistics.median(max(step) for step in zip(*times_by_rank))


# --- scaling -------------------------------------------------------------------------------------


def speedup(throughput: float, baseline: float) -> float:
    """Throughput (samples/s) relative to one process's."""
    if not baseline > 0:
        raise ValueError(f"baseline throughput must be positive, got {baseline}")
    return throughput / baseline


def efficiency(throughput: float, baseline: float, world_size: int) -> float:
    """Scaling efficiency: speedup / N (1.0 = perfect linear scaling)."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return speedup(throughput, baseline) / world_size


def overlap_fraction(t_compute: float, t_comm: float, t_step: float) -> float:
    """(t_compute + t_comm − t_step) / t_comm: the share of communication hidden by computation.

    1 when the step takes no longer than its computation, 0 when compute and communication
    simply add up, negative when running them together is slower than one after the other.
    """
    if not t_comm > 0:
        raise ValueError(f"t_comm must be positive, got {t_comm}")
    return (t_compute + t_comm - t_step) / t_comm


# --- what a kernel's computation uses ----------------------------------------------------------


def threads_that_computed(fn, share: float = 0.25) -> int | None:
    """How many of this process's threads used CPU time while ``fn()`` ran (Linux only).

    Reads each thread's CPU time from ``/proc/self/task`` before and after; a thread counts if it
    used at least ``share`` of the busiest thread's time (a kernel's idle helper threads use next
    to none). ``fn`` should run for a few tenths of a second: the counters tick every 10 ms.
    Returns None where ``/proc`` is not available (macOS, Windows).
    """
    if not os.path.isdir("/proc/self/task"):
        return None

    def cpu_ticks() -> dict[str, int]:
        ticks = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
        return ticks

    before = cpu_ticks()
    fn()
    after = cpu_ticks()
    used = [after[t] - before.get(t, 0) for t in after]
    busiest = max(used, default=0)
    return sum(u >= share * busiest for u in used) if busiest else 0


_CASTS_AND_VIEWS = {
    "ToCopyBackward0",
    "TBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "ViewBackward0",
    "UnsafeViewBackward0",
    "ExpandBackward0",
    "AliasBackward0",
}
SAVED_KINDS = ("activations", "copies of parameters", "parameters and inputs")


def _is_parameter_copy(tensor, parameter_ids: set[int]) -> bool:
    """Whether ``tensor`` was made from a parameter by casts and views only (e.g. autocast's 16-bit weights)."""
    fn = tensor.grad_fn
    while fn is not None:
        if fn.name() == "torch::autograd::AccumulateGrad":
            return id(fn.variable) in parameter_ids
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if fn.name() not in _CASTS_AND_VIEWS or len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


def saved_for_backward(loss_fn, parameters, inputs=()) -> dict[str, int]:
    """Bytes of the tensors autograd keeps for ``backward()`` while ``loss_fn()`` runs, by kind.

    Each storage counts once. Kinds (``SAVED_KINDS``):

    - ``"parameters and inputs"``: the parameters and the given input tensors themselves, saved
      by reference: they are in memory anyway, so keeping them costs nothing;
    - ``"copies of parameters"``: tensors made from a parameter by casts and views only, such as
      the 16-bit weights ``torch.autocast`` makes: new memory, kept until ``backward()``;
    - ``"activations"``: everything else, what the forward pass computed (including a 16-bit
      copy of the input).

    Calls ``backward()`` on the loss at the end, so that the graph is freed.
    """
    import torch

    parameters = list(parameters)
    parameter_ids = {id(p) for p in parameters}
    existing = {t.untyped_storage().data_ptr() for t in [*parameters, *inputs]}
    kinds: dict[int, tuple[str, int]] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in kinds:
            if storage.data_ptr() in existing:
                kind = "parameters and inputs"
            elif _is_parameter_copy(tensor, parameter_ids):
                kind = "copies of parameters"
            else:
                kind = "activations"
            kinds[storage.data_ptr()] = (kind, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = loss_fn()
    loss.backward()
    totals = dict.fromkeys(SAVED_KINDS, 0)
    for kind, nbytes in kinds.values():
        totals[kind] += nbytes
    return totals


# --- profiler traces -----------------------------------------------------------------------------


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of (start, end) intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def clip(intervals: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of the intervals that lie within [start, end]."""
    return [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]


COMM_NAMES = ("gloo:all_reduce", "nccl:all_reduce")


def _is_comm_kernel(event: dict) -> bool:
    return event.get("cat") == "kernel" and "allreduce" in event["name"].lower().replace("_", "")


def trace_steps(trace: dict, step_name: str = "train_step", backward_name: str = "backward") -> list[dict]:
    """Per profiled step of a chrome trace: the backward span and the all-reduces in it.

    The profiled script marks each step with ``record_function(step_name)`` and its
    ``loss.backward()`` with ``record_function(backward_name)``. Communication is, on CPU
    (gloo), the ``gloo:all_reduce`` events of gloo's worker threads (from the moment the worker
    starts a bucket to the moment it is done); on GPUs (nccl), the all-reduce kernels, compared
    with the GPU kernels that the backward pass launched.

    ``loss.backward()`` under DDP also waits for the last buckets, so the backward *computation*
    is taken as the span of autograd's functions (``autograd::engine::evaluate_function: ...``).

    Returns, per step: ``allreduces`` (how many), ``backward`` (start, end) in µs, ``comm_us``
    (time some all-reduce was running), ``hidden_us`` (of that, while backward was computing),
    and ``starts_before_backward_ends`` (whether the first all-reduce began before it ended).
    """
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]

    def span(e):
        return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))

    steps = sorted(span(e) for e in events if e["name"] == step_name)
    backwards = sorted(span(e) for e in events if e["name"] == backward_name)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    gpu = any(_is_comm_kernel(e) for e in kernels)
    if gpu:
        comm = [span(e) for e in kernels if _is_comm_kernel(e)]
        launches = [e for e in events if e.get("cat") == "cuda_runtime"]
    else:
        comm = [span(e) for e in events if e["name"] in COMM_NAMES]
    windows = []  # per step: the backward span (on GPUs: of the kernels the CPU's backward launched)
    for s0, s1 in steps:
        bwd = [b for b in backwards if s0 <= b[0] <= s1]
        if not bwd:
            continue
        b0, b1 = bwd[0]
        # loss.backward() under DDP returns only after waiting for every bucket: its span always
        # contains the communication. The *computation* is autograd's functions in that span.
        autograd = [
            span(e)
            for e in events
            if e["name"].startswith("autograd::engine::evaluate_function") and b0 <= float(e["ts"]) <= b1
        ]
        if autograd:
            b0, b1 = min(a for a, _ in autograd), max(b for _, b in autograd)
        if gpu:
            ids = {e.get("args", {}).get("correlation") for e in launches if b0 <= float(e["ts"]) <= b1}
            compute = [
                span(e) for e in kernels if not _is_comm_kernel(e) and e.get("args", {}).get("correlation") in ids
            ]
            if compute:
                b0, b1 = min(a for a, _ in compute), max(b for _, b in compute)
        windows.append((b0, b1))
    result = []
    for k, (b0, b1) in enumerate(windows):
        until = windows[k + 1][0] if k + 1 < len(windows) else float("inf")
        in_step = sorted(c for c in comm if b0 <= c[0] < until)  # started during or after this backward
        result.append(
            {
                "allreduces": len(in_step),
                "backward": (b0, b1),
                "comm_us": union_length(in_step),
                "hidden_us": union_length(clip(in_step, b0, b1)),
                "starts_before_backward_ends": bool(in_step) and in_step[0][0] < b1,
                "allreduce_spans": in_step,
            }
        )
    return result


# --- plots (thin layers on top) ------------------------------------------------------------------


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


def scaling_rows(report: dict, model: str) -> list[tuple[str, int, dict]]:
    """(label, processes, result) for one model of a bench_scaling JSON: DataParallel (if it
    ran), then DDP by process count. Each result has its own ``one_process_s`` baseline (timed
    alternately with it) and ``speedup`` over it."""
    m = report["models"][model]
    rows = []
    if "step_s" in m.get("data_parallel", {}):
        rows.append(("DataParallel", report["gpus"], m["data_parallel"]))
    rows += [("DDP", int(n), r) for n, r in sorted(m["ddp"].items(), key=lambda kv: int(kv[0]))]
    return rows


def plot_scaling(report: dict):
    """Throughput and efficiency against processes, one line per model, plus each step's split."""
    import matplotlib.pyplot as plt

    models = list(report["models"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
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
    for ax in axes[:2]:
        ax.set_xlabel("processes")
        ax.set_xticks(range(1, top + 1))
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("throughput relative to one process (same load)")
    axes[1].set_title("efficiency")
    # each model's DDP step at the largest N: compute, communication, the step as measured
    ax = axes[2]
    labels, y = [], 0
    for model in models:
        n, r = max(((int(k), v) for k, v in report["models"][model]["ddp"].items()), key=lambda kv: kv[0])
        if n < 2:
            continue
        scale = 1 / r["step_s"]  # as a share of the measured step
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
    threads = report.get("threads_per_process")
    fig.suptitle(f"{report['backend']} on {report['device']}" + (f", {threads} thread per process" if threads else ""))
    fig.tight_layout()
    return fig
