"""Predicted step time and speedup of synchronous data-parallel training (chapter 01).

A deliberately small model, so that every prediction can be checked by hand:

- **compute**: every worker runs forward + backward on its own batch in ``compute_s`` seconds,
  the same as one worker alone (weak scaling: the batch *per worker* is fixed).
- **communication**: after backward, the workers average a gradient of ``model_bytes`` bytes
  (S). A message of ``m`` bytes costs ``latency + m / bandwidth`` seconds (the α–β or Hockney
  model: α = latency, β = bandwidth in bytes per second).
- **overlap**: a fraction of the communication runs while backward is still computing, which
  can hide at most ``compute_s`` seconds of it.

Two ways to average (``algorithm``):

``"ps"``   a parameter server: every worker sends its gradient (S bytes) to one server and
           receives the new parameters (S bytes). The server receives N·S and sends N·S bytes
           through its one link, so its time grows linearly with N.
``"ring"`` ring all-reduce (reduce-scatter, then all-gather, over chunks of S/N bytes): in each
           of 2(N−1) steps every rank sends one chunk to its neighbour, all at the same time.
           Every rank sends 2(N−1)/N·S bytes, which tends to 2S, independent of N; the latency
           term 2(N−1)·α still grows with N.

With one worker there is nothing to average, so no algorithm sends anything: N = 1 is plain
single-device training, the baseline of every speedup.

What the model leaves out (and chapter 06b measures): stragglers, contention on shared links,
hierarchical topologies (NVLink inside a node, network between nodes), the optimizer step,
data loading, and the bucketing that makes overlap possible.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

ALGORITHMS = ("ring", "ps")


# --- argument checks: one clear, one-line message each ----------------------------------------


def _check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return int(world_size)


def _check_nonnegative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    if value == float("inf"):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _check_positive(name: str, value) -> float:
    value = _check_nonnegative(name, value)
    if value == 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _check_algorithm(algorithm) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return algorithm


# --- bytes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """Bytes one gradient averaging moves, and over how many sequential messages."""

    worker_sends: float  # bytes each worker sends
    worker_receives: float  # bytes each worker receives
    server_sends: float  # bytes the parameter server sends (0 for a ring: there is none)
    server_receives: float  # bytes the parameter server receives
    messages: int  # sequential messages on the busiest link: each one pays the latency once


def traffic(algorithm: str, world_size: int, model_bytes: float) -> Traffic:
    """Bytes sent and received per step to average a gradient of ``model_bytes`` (S) bytes.

    - ``"ps"``: each worker sends S and receives S; the server receives N·S and sends N·S, as
      2N sequential messages on its link.
    - ``"ring"``: each rank sends and receives 2(N−1)/N·S in 2(N−1) steps of S/N bytes.
    - N = 1: nothing (no one to average with).
    """
    algorithm = _check_algorithm(algorithm)
    n = _check_world_size(world_size)
    s = _check_nonnegative("model_bytes", model_bytes)
    if n == 1:
        return Traffic(0.0, 0.0, 0.0, 0.0, 0)
    if algorithm == "ps":
        return Traffic(s, s, n * s, n * s, 2 * n)
    per_rank = 2 * (n - 1) / n * s
    return Traffic(per_rank, per_rank, 0.0, 0.0, 2 * (n - 1))


# --- time ----------------------------------------------------------------------------------------


def message_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """α–β model: one message of ``nbytes`` costs ``latency + nbytes / bandwidth`` seconds."""
    nbytes = _check_nonnegative("nbytes", nbytes)
    bandwidth = _check_positive("bandwidth", bandwidth)
    latency = _check_nonnegative("latency", latency)
    return latency + nbytes / bandwidth


def comm_time(algorithm: str, world_size: int, model_bytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds to average a gradient of ``model_bytes`` over ``world_size`` (α–β model).

    - ``"ps"``:   2N·(α + S/β) — N pushes, then N pulls, one after another on the server's link
                  (it has one link of bandwidth β, like every worker).
    - ``"ring"``: 2(N−1)·(α + S/(N·β)) — 2(N−1) steps, all ranks sending a chunk of S/N at once.
    - N = 1:      0.
    """
    algorithm = _check_algorithm(algorithm)
    n = _check_world_size(world_size)
    s = _check_nonnegative("model_bytes", model_bytes)
    if n == 1:
        _check_positive("bandwidth", bandwidth)
        _check_nonnegative("latency", latency)
        return 0.0
    if algorithm == "ps":
        return 2 * n * message_time(s, bandwidth, latency)
    return 2 * (n - 1) * message_time(s / n, bandwidth, latency)


@dataclass(frozen=True)
class StepPrediction:
    """One predicted training step with ``world_size`` workers (times in seconds)."""

    world_size: int
    compute_s: float  # forward + backward on one worker's batch
    comm_s: float  # gradient averaging, if nothing overlapped
    hidden_s: float  # part of comm_s that ran during compute
    step_s: float  # compute_s + comm_s - hidden_s
    speedup: float  # throughput (samples/s) relative to one worker: N · compute_s / step_s
    efficiency: float  # speedup / N = compute_s / step_s


def predict(
    world_size: int,
    *,
    compute_s: float,
    model_bytes: float,
    bandwidth: float,
    latency: float = 0.0,
    overlap: float = 0.0,
    algorithm: str = "ring",
) -> StepPrediction:
    """Predicted step time, speedup and efficiency of data-parallel training on N workers.

    ``step = compute + comm − hidden`` with ``hidden = min(overlap · comm, compute)``: overlap 0
    runs communication after compute; overlap 1 gives ``max(compute, comm)``.

    The speedup is a **throughput** speedup under weak scaling: each worker keeps its batch, so
    N workers process N batches per step, and ``speedup = N · compute_s / step_s``. (Whether the
    larger global batch reaches the same accuracy in fewer steps is a separate question, about
    optimization, not about this model.)
    """
    n = _check_world_size(world_size)
    compute = _check_positive("compute_s", compute_s)
    overlap = _check_nonnegative("overlap", overlap)
    if overlap > 1:
        raise ValueError(f"overlap must be between 0 and 1, got {overlap!r}")
    comm = comm_time(algorithm, n, model_bytes, bandwidth, latency)
    hidden = min(overlap * comm, compute)
    step = compute + comm - hidden
    speedup = n * compute / step
    return StepPrediction(n, compute, comm, hidden, step, speedup, speedup / n)


def scaling(ns, **config) -> list[StepPrediction]:
    """``predict`` for every worker count in ``ns`` with the same configuration."""
    return [predict(n, **config) for n in ns]
