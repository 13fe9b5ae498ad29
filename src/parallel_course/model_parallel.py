"""Model-parallel illustrations (chapter 07a): split a model into stages, pipeline schedules as data.

A pipeline schedule is described twice, from the same data:

- ``stage_orders(kind, n_stages, n_microbatches)``: what each stage does, in order, as a list of
  ``("F", microbatch)`` / ``("B", microbatch)`` per stage. This is what a real executor follows
  (``scripts/c07_pipeline_executor.py`` runs such orders on one process per stage).
- ``timeline(orders)``: when each operation can run, given that a forward needs the previous
  stage's forward of the same micro-batch and a backward needs the next stage's backward: a list
  of ``Op(stage, slot, microbatch, kind, duration, chunk)``. Plots, the explorer widget and the
  bubble come from it.

``bubble_fraction(p, m) = (p - 1) / (m + p - 1)`` is the idle fraction of GPipe and 1F1B with
equal stages; ``peak_activations`` counts the micro-batches whose activations a stage holds at
most (GPipe: all m; 1F1B: at most p - stage).

Two more schedules change what an operation is (``ALL_KINDS``):

- "interleaved" (``interleaved_orders``): v model chunks per device, operations
  ``(kind, microbatch, chunk)``; with equal chunks and m a multiple of p its idle fraction is
  (p - 1) / (v m + p - 1);
- "zb-h1" (``zb_h1_orders``): each backward split into ``("B", i)`` (input gradient) and
  ``("W", i)`` (weight gradient); with F, B and W one slot each and m >= p a step takes
  3m + p - 1 slots, idle (p - 1) / (3m + p - 1), and every stage holds p micro-batches.

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
# Two more schedules, with their own bubble formulas: interleaved 1F1B (v model chunks per device)
# and ZB-H1 (each backward split into B and W). KINDS keeps the two that share (p-1)/(m+p-1).
ALL_KINDS = (*KINDS, "interleaved", "zb-h1")


class Op(NamedTuple):
    """One operation of a pipeline timeline: ``stage`` runs ``kind`` of ``microbatch`` from ``slot``.

    ``stage`` is the device (a row of the timeline); ``chunk`` is which of its model chunks runs
    (always 0 unless the schedule is interleaved).
    """

    stage: int
    slot: float
    microbatch: int
    kind: str  # "F" (forward), "B" (backward; with W: the input gradient only) or "W" (weight gradient)
    duration: float = 1
    chunk: int = 0


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


def interleaved_orders(n_stages: int, n_microbatches: int, n_chunks: int = 2) -> list[list[tuple[str, int, int]]]:
    """Interleaved 1F1B (Megatron-LM; ``ScheduleInterleaved1F1B``): each device holds ``n_chunks`` chunks.

    The model is cut into v * p chunks (virtual stages); device d holds chunks d, d + p, d + 2p, ...,
    its local chunks 0..v-1, so a micro-batch goes round the devices v times. Operations are
    ``(kind, microbatch, chunk)``. The rules, on device d:

    - forwards go by groups of p micro-batches: micro-batches 0..p-1 through chunk 0, the same
      ones through chunk 1, ..., then micro-batches p..2p-1 through chunk 0, and so on; backwards
      go in the same order with the chunks taken last to first;
    - (v - 1) p + 2 (p - 1 - d) warm-up forwards (at most all v m of them), then one forward and
      one backward in turn, then the remaining backwards.

    The number of micro-batches must be a multiple of p, as Megatron-LM requires.
    """
    _check_sizes(n_stages, n_microbatches)
    p, m, v = n_stages, n_microbatches, n_chunks
    if v < 1 or m % p:
        raise ValueError(f"interleaved 1F1B needs at least 1 chunk and m a multiple of p, got v={v}, m={m}, p={p}")

    def item(k: int, backward: bool) -> tuple[int, int]:
        """The k-th (micro-batch, chunk) of a device's forwards, or of its backwards."""
        group, within = divmod(k, p * v)
        chunk = within // p
        return group * p + within % p, v - 1 - chunk if backward else chunk

    total = v * m
    orders = []
    for device in range(p):
        warmup = min((v - 1) * p + 2 * (p - 1 - device), total)
        forwards = [("F", *item(k, False)) for k in range(total)]
        backwards = [("B", *item(k, True)) for k in range(total)]
        steady = [op for k in range(total - warmup) for op in (forwards[warmup + k], backwards[k])]
        orders.append(forwards[:warmup] + steady + backwards[total - warmup :])
    return orders


def zb_h1_orders(n_stages: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split in two.

    ``("B", i)`` computes only the gradient of the stage's input (what the stage before waits for)
    and ``("W", i)`` the gradient of its weights (what nobody waits for). The rules: stage s runs
    1F1B's forwards and B's in 1F1B's order, and the W of micro-batch i right after the B of
    micro-batch i + s: a later stage, which 1F1B leaves waiting longer at the start, puts off
    more W's and runs them at the end, in the slots where 1F1B would wait for the backward.
    """
    p, m = n_stages, n_microbatches
    orders = []
    for stage, order in enumerate(one_f_one_b_orders(p, m)):
        split = []
        for kind, i in order:
            split.append((kind, i))
            if kind == "B" and i - stage >= 0:
                split.append(("W", i - stage))
        split += [("W", i) for i in range(max(m - stage, 0), m)]
        orders.append(split)
    return orders


def stage_orders(kind: str, n_stages: int, n_microbatches: int, n_chunks: int = 2) -> list[list[tuple]]:
    """The per-stage order of operations of schedule ``kind`` (one of ``ALL_KINDS``).

    ``n_chunks``: the model chunks per device of "interleaved"; the other schedules ignore it.
    """
    if kind == "gpipe":
        return gpipe_orders(n_stages, n_microbatches)
    if kind == "1f1b":
        return one_f_one_b_orders(n_stages, n_microbatches)
    if kind == "interleaved":
        return interleaved_orders(n_stages, n_microbatches, n_chunks)
    if kind == "zb-h1":
        return zb_h1_orders(n_stages, n_microbatches)
    raise ValueError(f"unknown schedule {kind!r}: choose one of {ALL_KINDS}")


def _operation(op: Sequence) -> tuple[str, int, int]:
    """``(kind, microbatch)`` or ``(kind, microbatch, chunk)`` as ``(kind, microbatch, chunk)``."""
    kind, microbatch, *chunk = op
    return str(kind), int(microbatch), int(chunk[0]) if chunk else 0


def _name(kind: str, microbatch: int, chunk: int, chunks: bool) -> str:
    """Kind and micro-batch, "F3"; with ``chunks``, a letter for the chunk: "F3a" (chunk 0), "F3b", ..."""
    return f"{kind}{microbatch}" + (chr(ord("a") + chunk) if chunks else "")


def op_label(op: Op, chunks: bool = False) -> str:
    """An operation's label in grids and charts: "F3", or with ``chunks`` "F3a" (chunk 0), "F3b", ..."""
    return _name(op.kind, op.microbatch, op.chunk, chunks)


def validate_orders(orders: Sequence[Sequence[tuple]], n_microbatches: int | None = None) -> None:
    """Raise ``ValueError`` unless every stage runs F and B of every micro-batch exactly once, F first.

    With several chunks per device (operations ``(kind, microbatch, chunk)``): of every micro-batch
    on every chunk. Orders with W operations must run W of each once, after its B.
    """
    if not orders:
        raise ValueError("no stages")
    ops = [[_operation(op) for op in order] for order in orders]
    if n_microbatches is None:
        n_microbatches = sum(1 for kind, _, chunk in ops[0] if kind == "F" and chunk == 0)
    n_chunks = 1 + max(chunk for order in ops for _, _, chunk in order)
    kinds = ("B", "F", "W") if any(kind == "W" for order in ops for kind, _, _ in order) else ("B", "F")
    expected = sorted((k, i, c) for k in kinds for i in range(n_microbatches) for c in range(n_chunks))
    for stage, order in enumerate(ops):
        if sorted(order) != expected:
            shown = [op[:2] if n_chunks == 1 else op for op in order]
            what = " and ".join(kinds[::-1]) if len(kinds) == 2 else "F, B and W"
            raise ValueError(
                f"stage {stage} must run {what} of micro-batches 0..{n_microbatches - 1} once each"
                f"{f' on each of {n_chunks} chunks' if n_chunks > 1 else ''}, got {shown}"
            )
        position = {op: index for index, op in enumerate(order)}
        for _, i, c in (op for op in expected if op[0] == "F"):
            name = _name("", i, c, n_chunks > 1)
            if position[("B", i, c)] < position[("F", i, c)]:
                raise ValueError(f"stage {stage} runs B{name} before F{name}")
            if "W" in kinds and position[("W", i, c)] < position[("B", i, c)]:
                raise ValueError(f"stage {stage} runs W{name} before B{name}")


def timeline(
    orders: Sequence[Sequence[tuple]], t_forward: float = 1, t_backward: float = 1, t_weight: float = 1
) -> list[Op]:
    """When each operation runs if every stage follows its order as early as it can.

    A forward of micro-batch i on stage s waits for the forward of i on stage s - 1; a backward
    waits for the backward of i on stage s + 1 (the last stage: for its own forward). Raises
    ``ValueError`` for orders that are incomplete or can never finish (a deadlock).

    With v chunks per device (interleaved orders), the model's virtual stages are chunk c of
    device d = virtual stage c p + d: the forward of chunk c on device 0 waits for chunk c - 1 on
    the last device, and a backward of chunk c on the last device for chunk c + 1 on device 0.
    A W (weight gradient, ``t_weight``) waits for the B of the same micro-batch on its stage;
    nothing waits for a W.
    """
    validate_orders(orders)
    p = len(orders)
    ops_of = [[_operation(op) for op in order] for order in orders]
    last = p * (1 + max(chunk for order in ops_of for _, _, chunk in order)) - 1  # the last virtual stage
    durations = {"F": t_forward, "B": t_backward, "W": t_weight}
    done: dict[tuple[str, int, int, int], float] = {}  # (kind, virtual stage, microbatch) -> end time
    free = [0.0] * p  # when each stage is next free
    position = [0] * p
    ops: list[Op] = []
    while any(position[s] < len(ops_of[s]) for s in range(p)):
        progress = False
        for s in range(p):
            while position[s] < len(ops_of[s]):
                kind, i, chunk = ops_of[s][position[s]]
                virtual = chunk * p + s
                if kind == "F":
                    dep = ("F", virtual - 1, i) if virtual > 0 else None
                elif kind == "B":
                    dep = ("B", virtual + 1, i) if virtual < last else ("F", virtual, i)
                else:
                    dep = ("B", virtual, i)
                if dep is None:
                    ready = 0.0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                start = max(free[s], ready)
                done[(kind, virtual, i)] = free[s] = start + durations[kind]
                ops.append(Op(s, start, i, kind, durations[kind], chunk))
                position[s] += 1
                progress = True
        if not progress:
            waiting = {s: orders[s][position[s]] for s in range(p) if position[s] < len(orders[s])}
            raise ValueError(f"these orders deadlock: every stage waits for another, next ops {waiting}")
    return sorted(ops, key=lambda op: (op.stage, op.slot))


def schedule(
    kind: str,
    n_stages: int,
    n_microbatches: int,
    t_forward: float = 1,
    t_backward: float = 1,
    t_weight: float = 1,
    n_chunks: int = 2,
) -> list[Op]:
    """The timeline of schedule ``kind``: a list of ``Op(stage, slot, microbatch, kind)``.

    ``t_weight`` is the duration of a W (ZB-H1 only); ``n_chunks`` the chunks per device of
    "interleaved", whose operations each last ``t_forward`` or ``t_backward`` (a chunk's share).
    """
    return timeline(stage_orders(kind, n_stages, n_microbatches, n_chunks), t_forward, t_backward, t_weight)


def makespan(ops: Sequence[Op]) -> float:
    """Time from the first operation's start to the last one's end."""
    return max(op.slot + op.duration for op in ops) - min(op.slot for op in ops)


def idle_fraction(ops: Sequence[Op]) -> float:
    """The share of stage-time spent waiting: 1 - busy / (stages x makespan)."""
    n_stages = len({op.stage for op in ops})
    return 1 - sum(op.duration for op in ops) / (n_stages * makespan(ops))


def grid(ops: Sequence[Op]) -> list[list[str]]:
    """The timeline as rows of labels, one row per stage, one column per unit slot ("F0", "B3", "").

    With several chunks per device, a letter names the chunk: "F3a" on chunk 0, "F3b" on chunk 1.
    """
    n_stages = max(op.stage for op in ops) + 1
    width = int(round(makespan(ops)))
    chunks = any(op.chunk for op in ops)
    rows = [[""] * width for _ in range(n_stages)]
    for op in ops:
        for t in range(int(op.slot), int(op.slot + op.duration)):
            rows[op.stage][t] = op_label(op, chunks)
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


def in_flight(order: Sequence[tuple]) -> int:
    """The most micro-batches whose forward has run and whose backward has not, along ``order``.

    With W operations a micro-batch is held until its W: the weight gradient needs the stage's
    activations too. With several chunks, each (micro-batch, chunk) counts once.
    """
    ops = [_operation(op) for op in order]
    release = "W" if any(kind == "W" for kind, _, _ in ops) else "B"
    held = peak = 0
    for kind, _, _ in ops:
        held += 1 if kind == "F" else -1 if kind == release else 0
        peak = max(peak, held)
    return peak


def peak_activations(kind: str, n_stages: int, n_microbatches: int, n_chunks: int = 2) -> list[int]:
    """Per stage, the most micro-batches' activations held at once (GPipe: m; 1F1B: min(p - s, m)).

    For "interleaved" it counts (micro-batch, chunk) pairs, each 1/v of a stage's activations.
    """
    return [in_flight(order) for order in stage_orders(kind, n_stages, n_microbatches, n_chunks)]


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
