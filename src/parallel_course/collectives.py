"""All-reduce algorithms simulated in one process, step by step (chapter 03).

Each "rank" is an entry of a list of tensors. The simulations move chunks between list entries
exactly as the real algorithms move them between processes, and record every message: which
rank sends which chunk to whom, and how many bytes. Nothing here starts a process, so the
chapter can count bytes and draw the steps for any N in a fraction of a second.

- ``chunk_bounds``          where ``torch.tensor_split`` cuts a length into N chunks
- ``ring_allreduce``        reduce-scatter then all-gather over N chunks (the real ring)
- ``naive_ring_allreduce``  the tutorial "ring" that passes whole tensors round N-1 times
- ``ring_bytes_per_rank`` / ``naive_bytes_per_rank``  the byte counts, without the tensors
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PHASES = ("reduce-scatter", "all-gather")


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """(start, stop) of each of ``n`` chunks of ``length`` elements, as ``torch.tensor_split``.

    The first ``length % n`` chunks get one element more than the others; when ``length < n``
    the last chunks are empty, e.g. ``chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]``.
    """
    if n < 1:
        raise ValueError(f"need at least one chunk, got n={n}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    base, extra = divmod(length, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class Message:
    """One message of a simulated all-reduce."""

    phase: str  # "reduce-scatter", "all-gather", or "pass" for the naive version
    step: int  # 0-based step within its phase
    src: int
    dst: int
    chunk: int | None  # chunk index, None for a whole tensor
    nbytes: int


@dataclass
class Trace:
    """What a simulated all-reduce did: its results, messages, and the state after each step."""

    world_size: int
    results: list[torch.Tensor]
    messages: list[Message] = field(default_factory=list)
    # states[k][rank][chunk]: the ranks whose contributions chunk `chunk` of `rank` holds
    # after k steps (states[0] is the start, one entry per step after it).
    states: list[list[list[frozenset[int]]]] = field(default_factory=list)

    def bytes_sent(self) -> list[int]:
        """Bytes each rank sent, in rank order."""
        sent = [0] * self.world_size
        for m in self.messages:
            sent[m.src] += m.nbytes
        return sent

    def bytes_received(self) -> list[int]:
        received = [0] * self.world_size
        for m in self.messages:
            received[m.dst] += m.nbytes
        return received

    def steps(self) -> list[list[Message]]:
        """The messages grouped by step (all messages of a step travel at the same time)."""
        grouped: dict[tuple[int, int], list[Message]] = {}
        for m in self.messages:
            grouped.setdefault((PHASES.index(m.phase) if m.phase in PHASES else 0, m.step), []).append(m)
        return [grouped[k] for k in sorted(grouped)]


def _check_inputs(tensors: list[torch.Tensor]) -> None:
    if not tensors:
        raise ValueError("need at least one rank's tensor")
    shape, dtype = tensors[0].shape, tensors[0].dtype
    for rank, t in enumerate(tensors):
        if t.shape != shape or t.dtype != dtype:
            raise ValueError(
                f"every rank needs a tensor of the same shape and dtype: rank 0 has "
                f"{tuple(shape)} {dtype}, rank {rank} has {tuple(t.shape)} {t.dtype}"
            )


def ring_allreduce(tensors: list[torch.Tensor]) -> Trace:
    """Simulate a ring all-reduce (SUM) of one tensor per rank; the inputs are not changed.

    Rank r sends to rank (r + 1) % N and receives from rank (r - 1) % N. The flattened tensor
    is cut into N chunks (``chunk_bounds``).

    - reduce-scatter, steps s = 0 .. N-2: rank r sends chunk (r - s) % N; the receiver adds it
      to its own copy of that chunk. Afterwards rank r holds the full sum of chunk (r + 1) % N.
    - all-gather, steps s = 0 .. N-2: rank r sends chunk (r + 1 - s) % N, a finished sum; the
      receiver overwrites its copy.

    Every rank sends 2(N-1) chunks: 2(N-1)/N of the tensor when N divides its length.
    """
    _check_inputs(tensors)
    n = len(tensors)
    shape = tensors[0].shape
    data = [t.detach().flatten().clone() for t in tensors]
    bounds = chunk_bounds(data[0].numel(), n)
    itemsize = data[0].element_size()
    contrib = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    trace = Trace(world_size=n, results=[], states=[[list(row) for row in contrib]])

    for phase in PHASES:
        for s in range(n - 1):
            # All ranks send at the same time: read every outgoing chunk before writing any.
            outgoing = []
            for r in range(n):
                c = (r - s) % n if phase == "reduce-scatter" else (r + 1 - s) % n
                lo, hi = bounds[c]
                outgoing.append((r, (r + 1) % n, c, data[r][lo:hi].clone(), contrib[r][c]))
            for src, dst, c, payload, who in outgoing:
                lo, hi = bounds[c]
                if phase == "reduce-scatter":
                    data[dst][lo:hi] += payload
                    contrib[dst][c] = contrib[dst][c] | who
                else:
                    data[dst][lo:hi] = payload
                    contrib[dst][c] = who
                trace.messages.append(Message(phase, s, src, dst, c, (hi - lo) * itemsize))
            trace.states.append([list(row) for row in contrib])
    trace.results = [d.reshape(shape) for d in data]
    return trace


def naive_ring_allreduce(tensors: list[torch.Tensor]) -> Trace:
    """Simulate the tutorial "ring": whole tensors passed round the ring N-1 times (SUM).

    At step s every rank sends the whole tensor it received at step s-1 (its own at s = 0) to
    rank (r + 1) % N and adds what it receives to its total. The result is right, but every
    rank sends (N-1) whole tensors: (N-1)·S bytes, growing with N (misconception M13).
    """
    _check_inputs(tensors)
    n = len(tensors)
    shape = tensors[0].shape
    nbytes = tensors[0].numel() * tensors[0].element_size()
    totals = [t.detach().flatten().clone() for t in tensors]
    passing = [t.detach().flatten().clone() for t in tensors]
    holds = [frozenset({r}) for r in range(n)]
    passing_from = [frozenset({r}) for r in range(n)]
    trace = Trace(world_size=n, results=[], states=[[[h] for h in holds]])
    for s in range(n - 1):
        received = [None] * n
        for r in range(n):
            dst = (r + 1) % n
            received[dst] = (passing[r], passing_from[r])
            trace.messages.append(Message("pass", s, r, dst, None, nbytes))
        for r in range(n):
            payload, who = received[r]
            totals[r] += payload
            holds[r] = holds[r] | who
            passing[r], passing_from[r] = payload, who
        trace.states.append([[h] for h in holds])
    trace.results = [t.reshape(shape) for t in totals]
    return trace


def ring_bytes_per_rank(n: int, numel: int, itemsize: int = 4) -> list[int]:
    """Bytes each rank sends in a ring all-reduce of ``numel`` elements over ``n`` ranks."""
    sizes = [hi - lo for lo, hi in chunk_bounds(numel, n)]
    sent = []
    for r in range(n):
        rs = sum(sizes[(r - s) % n] for s in range(n - 1))
        ag = sum(sizes[(r + 1 - s) % n] for s in range(n - 1))
        sent.append((rs + ag) * itemsize)
    return sent


def naive_bytes_per_rank(n: int, numel: int, itemsize: int = 4) -> list[int]:
    """Bytes each rank sends when whole tensors go round the ring N-1 times."""
    if n < 1:
        raise ValueError(f"need at least one rank, got n={n}")
    return [(n - 1) * numel * itemsize] * n


def describe_step(trace: Trace, k: int) -> str:
    """One line per message of step ``k`` (0-based over both phases), for printing."""
    step = trace.steps()[k]
    lines = []
    for m in step:
        what = f"chunk {m.chunk}" if m.chunk is not None else "whole tensor"
        lines.append(f"{m.phase} step {m.step}: rank {m.src} -> rank {m.dst}: {what} ({m.nbytes} bytes)")
    return "\n".join(lines)


def state_table(trace: Trace, k: int) -> list[list[str]]:
    """The state after ``k`` steps as text: cell [rank][chunk] lists the summed ranks, "0+1+2"."""
    return [["+".join(str(i) for i in sorted(cell)) for cell in row] for row in trace.states[k]]
