"""Model-parallel illustrations (chapter 07a): split a model into stages, pipeline schedules as data.

A pipeline schedule is described twice, from the same data:

- ``stage_orders(kind, n_stages, n_microbatches)``: what each stage does, in order, as a list of
  ``("F", microbatch)`` / ``("B", microbatch)`` per stage. This is what a real executor follows
  (``scripts/c07_pipeline_executor.py`` runs such orders on one process per stage).
- ``timeline(orders)``: when each operation can run, given that a forward needs the previous
  stage's forward of the same micro-batch and a backward needs the next stage's backward: a list
  of ``Op(stage, slot, microbatch, kind)``. Plots, the explorer widget and the bubble come from it.

``bubble_fraction(p, m) = (p - 1) / (m + p - 1)`` is the idle fraction of GPipe and 1F1B with
equal stages; ``peak_activations`` counts the micro-batches whose activations a stage holds at
most (GPipe: all m; 1F1B: at most p - stage).

PyTorch has no ``model_parallel`` module: model parallelism is placing submodules on devices
(``split_sequential`` + ``SplitModel`` here), ``torch.distributed.pipelining`` and
``torch.distributed.tensor.parallel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn as nn

KINDS = ("gpipe", "1f1b")


class Op(NamedTuple):
    """One operation of a pipeline timeline: ``stage`` runs ``kind`` of ``microbatch`` from ``slot``."""

    stage: int
    slot: float
    microbatch: int
    kind: str  # "F" (forward) or "B" (backward)
    duration: float = 1


def _check_sizes(n_stages: int, n_microbatches: int) -> None:
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"need at least 1 stage and 1 micro-batch, got {n_stages} and {n_microbatches}")


# --- schedules as data ------------------------------------------------------------------------


def gpipe_orders(n_stages: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """GPipe (all forward, then all backward): every stage runs F0..F(m-1), then B0..B(m-1)."""
    _check_sizes(n_stages, n_microbatches)
    m = n_microbatches
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(n_stages)]


def one_f_one_b_orders(n_stages: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """1F1B (PipeDream-flush), from its rule: stage s never holds more than p - s micro-batches.

    Each stage runs a forward while it holds fewer than p - s micro-batches' activations and
    forwards remain, otherwise the backward of its oldest micro-batch. That gives p - 1 - s
    warm-up forwards, then one forward and one backward in turn, then the remaining backwards.
    GPipe holds all m.
    """
    _check_sizes(n_stages, n_microbatches)
    p, m = n_stages, n_microbatches
    orders = []
    for stage in range(p):
        order, forwards, backwards = [], 0, 0
        while backwards < m:
            if forwards < m and forwards - backwards < p - stage:
                order.append(("F", forwards))
                forwards += 1
            else:
                order.append(("B", backwards))
                backwards += 1
        orders.append(order)
    return orders


def stage_orders(kind: str, n_stages: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """The per-stage order of operations of schedule ``kind`` ("gpipe" or "1f1b")."""
    if kind == "gpipe":
        return gpipe_orders(n_stages, n_microbatches)
    if kind == "1f1b":
        return one_f_one_b_orders(n_stages, n_microbatches)
    raise ValueError(f"unknown schedule {kind!r}: choose one of {KINDS}")


def validate_orders(orders: Sequence[Sequence[tuple[str, int]]], n_microbatches: int | None = None) -> None:
    """Raise ``ValueError`` unless every stage runs F and B of every micro-batch exactly once, F first."""
    if not orders:
        raise ValueError("no stages")
    if n_microbatches is None:
        n_microbatches = sum(1 for kind, _ in orders[0] if kind == "F")
    expected = sorted([("B", i) for i in range(n_microbatches)] + [("F", i) for i in range(n_microbatches)])
    for stage, order in enumerate(orders):
        ops = [(str(kind), int(mb)) for kind, mb in order]
        if sorted(ops) != expected:
            raise ValueError(
                f"stage {stage} must run F and B of micro-batches 0..{n_microbatches - 1} once each, got {ops}"
            )
        for i in range(n_microbatches):
            if ops.index(("B", i)) < ops.index(("F", i)):
                raise ValueError(f"stage {stage} runs B{i} before F{i}")


def timeline(orders: Sequence[Sequence[tuple[str, int]]], t_forward: float = 1, t_backward: float = 1) -> list[Op]:
    """When each operation runs if every stage follows its order as early as it can.

    A forward of micro-batch i on stage s waits for the forward of i on stage s - 1; a backward
    waits for the backward of i on stage s + 1 (the last stage: for its own forward). Raises
    ``ValueError`` for orders that are incomplete or can never finish (a deadlock).
    """
    validate_orders(orders)
    p = len(orders)
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, microbatch) -> end time
    free = [0.0] * p  # when each stage is next free
    position = [0] * p
    ops: list[Op] = []
    while any(position[s] < len(orders[s]) for s in range(p)):
        progress = False
        for s in range(p):
            while position[s] < len(orders[s]):
                kind, i = orders[s][position[s]]
                kind, i = str(kind), int(i)
                dep = ("F", s - 1, i) if kind == "F" else ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if kind == "F" and s == 0:
                    ready = 0.0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                start = max(free[s], ready)
                duration = t_forward if kind == "F" else t_backward
                done[(kind, s, i)] = free[s] = start + duration
                ops.append(Op(s, start, i, kind, duration))
                position[s] += 1
                progress = True
        if not progress:
            waiting = {s: orders[s][position[s]] for s in range(p) if position[s] < len(orders[s])}
            raise ValueError(f"these orders deadlock: every stage waits for another, next ops {waiting}")
    return sorted(ops, key=lambda op: (op.stage, op.slot))


def schedule(kind: str, n_stages: int, n_microbatches: int, t_forward: float = 1, t_backward: float = 1) -> list[Op]:
    """The timeline of schedule ``kind``: a list of ``Op(stage, slot, microbatch, kind)``."""
    return timeline(stage_orders(kind, n_stages, n_microbatches), t_forward, t_backward)


def makespan(ops: Sequence[Op]) -> float:
    """Time from the first operation's start to the last one's end."""
    return max(op.slot + op.duration for op in ops) - min(op.slot for op in ops)


def idle_fraction(ops: Sequence[Op]) -> float:
    """The share of stage-time spent waiting: 1 - busy / (stages x makespan)."""
    n_stages = len({op.stage for op in ops})
    return 1 - sum(op.duration for op in ops) / (n_stages * makespan(ops))


def grid(ops: Sequence[Op]) -> list[list[str]]:
    """The timeline as rows of labels, one row per stage, one column per unit slot ("F0", "B3", "")."""
    n_stages = max(op.stage for op in ops) + 1
    width = int(round(makespan(ops)))
    rows = [[""] * width for _ in range(n_stages)]
    for op in ops:
        for t in range(int(op.slot), int(op.slot + op.duration)):
            rows[op.stage][t] = f"{op.kind}{op.microbatch}"
    return rows


def format_grid(ops: Sequence[Op]) -> str:
    """The grid as text: one line per stage, ``.`` for an idle slot."""
    cells = grid(ops)
    width = max(len(c) for row in cells for c in row)
    return "\n".join(f"stage {s}: " + " ".join((c or ".").rjust(width) for c in row) for s, row in enumerate(cells))


def bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """Idle fraction of a GPipe or 1F1B step with equal stages: (p - 1) / (m + p - 1)."""
    _check_sizes(n_stages, n_microbatches)
    return (n_stages - 1) / (n_microbatches + n_stages - 1)


def in_flight(order: Sequence[tuple[str, int]]) -> int:
    """The most micro-batches whose forward has run and whose backward has not, along ``order``."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def peak_activations(kind: str, n_stages: int, n_microbatches: int) -> list[int]:
    """Per stage, the most micro-batches' activations held at once (GPipe: m; 1F1B: min(p - s, m))."""
    return [in_flight(order) for order in stage_orders(kind, n_stages, n_microbatches)]


def measured_idle_fraction(busy: Sequence[Sequence[Sequence]]) -> float:
    """Idle fraction of a real run from each stage's busy intervals ``(start, end, ...)`` in seconds."""
    intervals = [(iv[0], iv[1]) for stage in busy for iv in stage]
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    return 1 - sum(end - start for start, end in intervals) / (len(busy) * span)


# --- naive model parallelism: submodules on devices -------------------------------------------


def stage_devices(n_stages: int, use_gpus: bool = True) -> list[torch.device]:
    """``cuda:0 .. cuda:n-1`` when there are that many GPUs (and ``use_gpus``), else the CPU for every stage.

    On the CPU all stages share the same cores: a one-process split there only shows that the
    result is unchanged; chapter 07a runs stages in separate processes to show their timing.
    """
    if use_gpus and torch.cuda.is_available() and torch.cuda.device_count() >= n_stages:
        return [torch.device("cuda", i) for i in range(n_stages)]
    return [torch.device("cpu")] * n_stages


def split_sequential(model: nn.Sequential, n_stages: int) -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` consecutive pieces with about equal numbers of parameters.

    Cuts fall only between children, before a child with parameters where possible (so that an
    activation function stays with the layer before it); each piece shares its modules with
    ``model``.
    """
    children = list(model)
    if not 1 <= n_stages <= len(children):
        raise ValueError(f"cannot cut {len(children)} layers into {n_stages} stages")
    sizes = [sum(p.numel() for p in c.parameters()) for c in children]
    total = sum(sizes)
    cuts, running = [], 0
    for index, size in enumerate(sizes[:-1]):
        running += size
        # cut after this layer when it passes the next equal share (and leave a layer for the rest)
        left, needed = len(children) - index - 1, n_stages - 1 - len(cuts)
        if needed and (running >= total * (len(cuts) + 1) / n_stages and sizes[index + 1] > 0 or left == needed):
            cuts.append(index + 1)
    while len(cuts) < n_stages - 1:  # parameter-free tails: cut as late as possible
        cuts.append(len(children) - (n_stages - 1 - len(cuts)))
    bounds = [0, *cuts, len(children)]
    return [nn.Sequential(*children[a:b]) for a, b in zip(bounds, bounds[1:])]


class SplitModel(nn.Module):
    """Naive model parallelism: stage k lives on ``devices[k]``; activations move between them.

    Only one stage works at a time: stage k + 1 waits for stage k's whole batch.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[torch.device | str]):
        super().__init__()
        if len(stages) != len(devices):
            raise ValueError(f"{len(stages)} stages but {len(devices)} devices")
        self.devices = [torch.device(d) for d in devices]
        self.stages = nn.ModuleList(stage.to(d) for stage, d in zip(stages, self.devices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device))  # the activation crosses to the next device here
        return x


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters."""
    return sum(p.numel() * p.element_size() for p in module.parameters())
