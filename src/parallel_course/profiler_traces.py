"""Reading a ``torch.profiler`` Chrome trace of DDP steps: backward and the all-reduces (chapter 06c).

``scripts/c06_amp_and_profiler.py`` writes the trace; ``trace_steps`` finds, per profiled step,
when ``backward()`` computed and when the all-reduces ran, and how much of the communication the
computation hid.
"""

from __future__ import annotations


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


def _span(event: dict) -> tuple[float, float]:
    return float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0))


def _backward_computation(events, kernels, launches, b0, b1, gpu):
    """The span of the computation inside one ``backward`` span (b0, b1).

    ``loss.backward()`` under DDP returns only after waiting for every bucket: its span always
    contains the communication. The *computation* is autograd's functions in that span; on GPUs,
    the kernels those functions launched.
    """
    autograd = [
        _span(e)
        for e in events
        if e["name"].startswith("autograd::engine::evaluate_function") and b0 <= float(e["ts"]) <= b1
    ]
    if autograd:
        b0, b1 = min(a for a, _ in autograd), max(b for _, b in autograd)
    if gpu:
        ids = {e.get("args", {}).get("correlation") for e in launches if b0 <= float(e["ts"]) <= b1}
        compute = [_span(e) for e in kernels if not _is_comm_kernel(e) and e.get("args", {}).get("correlation") in ids]
        if compute:
            b0, b1 = min(a for a, _ in compute), max(b for _, b in compute)
    return b0, b1


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
    steps = sorted(_span(e) for e in events if e["name"] == step_name)
    backwards = sorted(_span(e) for e in events if e["name"] == backward_name)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    gpu = any(_is_comm_kernel(e) for e in kernels)
    launches = [e for e in events if e.get("cat") == "cuda_runtime"]
    if gpu:
        comm = [_span(e) for e in kernels if _is_comm_kernel(e)]
    else:
        comm = [_span(e) for e in events if e["name"] in COMM_NAMES]
    # per step: the span of backward's computation (on GPUs: of the kernels the CPU's backward launched)
    windows = []
    for s0, s1 in steps:
        bwd = [b for b in backwards if s0 <= b[0] <= s1]
        if bwd:
            windows.append(_backward_computation(events, kernels, launches, *bwd[0], gpu))
    result = []
    for k, (b0, b1) in enumerate(windows):
        until = windows[k + 1][0] if k + 1 < len(windows) else float("inf")
        # the all-reduces that started during or after this backward, before the next one
        in_step = sorted(c for c in comm if b0 <= c[0] < until)
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


def _all_reduces(n: int) -> str:
    return f"{n} all-reduce{'' if n == 1 else 's'}"


def describe_trace(steps: list[dict], top: list[dict], key: str) -> tuple[str, str]:
    """The text alternative of chapter 06c's trace figure, with the measured times (ms after the
    first backward began), and a plain text without them: which all-reduces ran against which
    backward, and which operators were busiest, differ from run to run; nbval compares the plain."""
    t0 = steps[0]["backward"][0]
    where = "device" if key == "self_device_us" else "CPU"
    layout = (
        f"Left: for each of {len(steps)} profiled DDP steps on rank 0, backward()'s computation as a bar, and "
        "its bucket all-reduces as bars beneath it, in ms since the first backward began. Right: the "
        f"{len(top)} operators with the most {where} self time."
    )
    measured = []
    for k, s in enumerate(steps, 1):
        b0, b1 = ((t - t0) / 1e3 for t in s["backward"])
        spans = ", ".join(f"{(a - t0) / 1e3:.1f} to {(b - t0) / 1e3:.1f}" for a, b in s["allreduce_spans"])
        share = s["hidden_us"] / max(s["comm_us"], 1e-9)
        measured.append(
            f"Step {k}: backward from {b0:.1f} to {b1:.1f} ms; {_all_reduces(s['allreduces'])}, {spans} ms; "
            f"{share:.0%} of their time during backward."
        )
    ops = "; ".join(f"{o['name']} {o[key] / 1e3:.1f} ms" for o in top)
    alt = f"{layout} {' '.join(measured)} Busiest operators: {ops}."
    counted = ", ".join(
        f"step {k}: {_all_reduces(s['allreduces'])}, the first one "
        + ("before" if s["starts_before_backward_ends"] else "after")
        + " backward ended"
        for k, s in enumerate(steps, 1)
    )
    varies = "(the times, and which operators were busiest, differ from run to run)"
    plain = f"{layout} {counted[:1].upper()}{counted[1:]} {varies}."
    return alt, plain
