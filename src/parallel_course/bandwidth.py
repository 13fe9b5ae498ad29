"""An all-reduce's bandwidths and its α–β fit (chapter 06a).

Plain functions on the numbers ``scripts/bench_allreduce.py`` measures; the script imports them
(its table's algbw and busbw, its fit).

Definitions (those of nccl-tests, ``doc/PERFORMANCE.md`` in NVIDIA/nccl-tests):

- ``algbw = bytes / time``: the size of the tensor over the time of one all-reduce;
- ``busbw = algbw · 2(N−1)/N``: the rate at which each rank sends (and receives) in a ring
  all-reduce, comparable with the hardware's bandwidth per direction whatever the number of ranks N;
- the α–β (Hockney) model of an all-reduce of S bytes: ``t(S) = α + (2(N−1)/N) · S / β``, α the
  fixed cost of one call, β the bus bandwidth it tends to for large messages.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


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
    let the largest message decide everything and leave α meaningless.
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


def median_of_slowest(times_by_rank: list[list[float]]) -> float:
    """Median over iterations of the slowest rank's time (a collective ends when the last rank does)."""
    if not times_by_rank or not times_by_rank[0]:
        raise ValueError("need at least one rank with at least one time")
    if len({len(t) for t in times_by_rank}) != 1:
        raise ValueError("every rank must report the same number of iterations")
    return statistics.median(max(step) for step in zip(*times_by_rank))
