"""Chapter 13a's figures, drawn from its own ring: ``record_ring`` runs
``context_parallel.ring_attention`` itself, one thread per rank, its send to the next rank replaced
by a hand-over between the threads, and records which key/value block every rank holds at every
step and which block pairs it computes with which mask. Each position's value is its own number,
so the tensors the ring passes say where in the sequence they come from.

``ring_steps`` turns that record into what is drawn where; the ``draw_`` functions only place it on
Axes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest import mock

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Polygon, Rectangle

from . import context_parallel as cp

# One colour per rank (the split), and one per kind of block pair.
RANK_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff", "#d9d9d9"]
KIND_COLOURS = {"full": "#3a6ea5", "causal": "#8fb8e0", "skip": "#eeeeee"}
KIND_NAMES = {"full": "full: every key before every query", "causal": "diagonal: causal mask", "skip": "skipped"}


@dataclass
class RingStep:
    """What one rank did at one step of the ring: the chunks of the key/value block it held (and
    the rank they started on), its own query chunks, and per pair of its query chunk and a held key chunk the mask it
    computed with ("full", "causal") or "skip" where it computed nothing."""

    rank: int
    step: int
    source: int
    query_chunks: list[int]
    key_chunks: list[int]
    pairs: dict[tuple[int, int], str] = field(default_factory=dict)


@dataclass
class RingRecord:
    world_size: int
    layout: str
    seq_len: int
    held: list[list[list[int]]]
    computed: list[list[list[tuple[int, int, str]]]]


def _chunks(positions: torch.Tensor, chunk_len: int) -> list[int]:
    found: list[int] = []
    for p in positions.flatten().tolist():
        c = int(round(p)) // chunk_len
        if c not in found:
            found.append(c)
    return found


def record_ring(world_size: int, layout: str, seq_len: int | None = None, timeout: float = 20.0) -> RingRecord:
    """Run ``cp.ring_attention`` on ``world_size`` simulated ranks (threads of this process) and
    record, per rank and step, the key chunks it held and the (query chunk, key chunk, mask) of every
    block it computed. Nothing is skipped or computed here that the ring itself did not."""
    n_chunks = cp.chunk_count(world_size, layout)
    seq_len = seq_len or 2 * n_chunks
    chunk_len = seq_len // n_chunks
    positions = torch.arange(seq_len, dtype=torch.float32).reshape(1, 1, seq_len, 1)
    held = [[] for _ in range(world_size)]
    computed = [[[]] for _ in range(world_size)]
    mailbox: list[torch.Tensor | None] = [None] * world_size
    barrier = threading.Barrier(world_size, timeout=timeout)
    original_block_attention = cp.block_attention

    def rotate(kv, group):
        # What the rank held this step, then the hand-over to rank r+1 (from rank r-1).
        if len(held[group.rank]) == 0:
            held[group.rank].append(_chunks(kv[0], chunk_len))
        mailbox[group.rank] = kv
        barrier.wait()
        received = mailbox[(group.rank - 1) % world_size]
        barrier.wait()
        held[group.rank].append(_chunks(received[0], chunk_len))
        computed[group.rank].append([])
        return received

    def block_attention(q, k, v, *, mask):
        rank = threading.current_thread().rank
        q_chunk, k_chunk = _chunks(q, chunk_len)[0], _chunks(k, chunk_len)[0]
        computed[rank][-1].append((q_chunk, k_chunk, mask))
        return original_block_attention(q, k, v, mask=mask)

    fake_dist = SimpleNamespace(get_rank=lambda g: g.rank, get_world_size=lambda g: g.size)
    errors: list[BaseException] = []

    def run(rank):
        threading.current_thread().rank = rank
        share = cp.split_sequence(positions, rank, world_size, layout)
        try:
            cp.ring_attention(share, share, share, SimpleNamespace(rank=rank, size=world_size), layout=layout)
        except BaseException as error:
            # Re-raised in the caller's thread; the other ranks stop waiting for this one.
            errors.append(error)
            barrier.abort()
        if not held[rank]:
            held[rank].append(_chunks(share, chunk_len))

    with (
        mock.patch.object(cp, "dist", fake_dist),
        mock.patch.object(cp, "rotate", rotate),
        mock.patch.object(cp, "block_attention", block_attention),
    ):
        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
    if errors:
        raise errors[0]
    return RingRecord(world_size, layout, seq_len, held, computed)


def ring_steps(record: RingRecord) -> list[list[RingStep]]:
    """Per rank, per step: the held block, its source rank, and each block pair's mask (a pair the
    ring did not compute is "skip")."""
    n = record.world_size
    owner = {c: r for r in range(n) for c in cp.chunks_of(r, n, record.layout)}
    steps = []
    for rank in range(n):
        mine = cp.chunks_of(rank, n, record.layout)
        row = []
        for step, (keys, done) in enumerate(zip(record.held[rank], record.computed[rank])):
            pairs = {(q, k): "skip" for q in mine for k in keys}
            pairs.update({(q, k): mask for q, k, mask in done})
            row.append(RingStep(rank, step, owner[keys[0]], mine, keys, pairs))
        steps.append(row)
    return steps


def pairs_computed(steps: list[list[RingStep]], seq_len: int, layout: str) -> list[int]:
    """Query-key pairs each rank computed, counted from the drawn block pairs (a diagonal block
    counts its lower triangle): what ``cp.pairs_per_rank`` says."""
    size = seq_len // cp.chunk_count(len(steps), layout)
    cost = {"skip": 0, "causal": size * (size + 1) // 2, "full": size * size}
    return [sum(cost[kind] for s in row for kind in s.pairs.values()) for row in steps]


def _pair_square(ax, x: float, y: float, side: float, kind: str) -> None:
    ax.add_patch(Rectangle((x, y), side, side, facecolor=KIND_COLOURS["skip"], edgecolor="0.5", linewidth=0.8))
    if kind == "full":
        ax.add_patch(Rectangle((x, y), side, side, facecolor=KIND_COLOURS["full"], edgecolor="0.5", linewidth=0.8))
    elif kind == "causal":
        # Query rows downwards, key columns rightwards: the lower-left triangle is kept.
        triangle = [(x, y + side), (x, y), (x + side, y)]
        ax.add_patch(Polygon(triangle, closed=True, facecolor=KIND_COLOURS["causal"], edgecolor="0.5", linewidth=0.8))


def draw_split(ax, world_size: int, seq_len: int, layout: str) -> None:
    """The sequence's positions, coloured by the rank that holds them (the layout's split)."""
    n_chunks = cp.chunk_count(world_size, layout)
    size = seq_len // n_chunks
    for rank in range(world_size):
        for c in cp.chunks_of(rank, world_size, layout):
            ax.add_patch(
                Rectangle((c * size, 0), size, 1, facecolor=RANK_COLOURS[rank % 8], edgecolor="black", linewidth=0.8)
            )
            ax.text((c + 0.5) * size, 0.5, f"chunk {c}\nrank {rank}", ha="center", va="center", fontsize=12)
    ax.set(xlim=(0, seq_len), ylim=(0, 1), yticks=[])
    ax.set_xticks([c * size for c in range(n_chunks + 1)])
    ax.tick_params(labelsize=11)
    ax.set_xlabel("position in the sequence", fontsize=12)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def draw_ring_steps(ax, steps: list[list[RingStep]], work: list[int]) -> None:
    """A row per rank, a column per step: each cell on the colour of the rank whose K/V block the
    rank holds, with a square per pair (query chunk row "q", key chunk column "k") filled as
    computed: whole, lower triangle (diagonal), or empty (skipped); the rank's query-key pairs in
    all at the end of its row."""
    n = len(steps)
    dx, dy = 1.5, 1.45
    for rank, row in enumerate(steps):
        y = (n - 1 - rank) * dy
        mine = row[0].query_chunks
        ax.text(-0.3, y + 0.45, f"rank {rank}", ha="right", va="center", fontsize=14)
        for s in row:
            side = 0.8 / max(len(mine), len(s.key_chunks))
            x0 = s.step * dx + 0.3
            ax.add_patch(
                Rectangle(
                    (x0 - 0.22, y - 0.08),
                    1.24,
                    1.33,
                    facecolor=RANK_COLOURS[s.source % 8],
                    edgecolor="none",
                    alpha=0.55,
                )
            )
            ax.text(x0 + 0.4, y + 1.2, f"K/V of rank {s.source}", ha="center", va="top", fontsize=11.5)
            for j, k in enumerate(s.key_chunks):
                ax.text(x0 + (j + 0.5) * side, y + 0.82, f"k{k}", ha="center", va="bottom", fontsize=10)
            for i, q in enumerate(mine):
                ax.text(x0 - 0.03, y + 0.8 - (i + 0.5) * side, f"q{q}", ha="right", va="center", fontsize=10)
                for j, k in enumerate(s.key_chunks):
                    _pair_square(ax, x0 + j * side, y + 0.8 - (i + 1) * side, side, s.pairs[(q, k)])
        ax.text(n * dx + 0.2, y + 0.4, f"{work[rank]}\npairs", ha="left", va="center", fontsize=13)
    for step in range(n):
        ax.text(step * dx + 0.7, n * dy + 0.02, f"step {step}", ha="center", va="bottom", fontsize=13)
    ax.set(xlim=(-1.3, n * dx + 1.0), ylim=(-0.15, n * dy + 0.35))
    ax.axis("off")


def ring_figure(record: RingRecord) -> Figure:
    """One layout: its split of the sequence above, its ring steps below, a key to the squares."""
    steps = ring_steps(record)
    fig = Figure(figsize=(10, 8.2), layout="constrained")
    fig.suptitle(
        f"Causal ring attention, {record.layout} split, {record.world_size} ranks, as cp.ring_attention ran it:\n"
        "after each step, every rank passes the K/V block it holds to rank r+1",
        fontsize=14,
    )
    grid = fig.add_gridspec(2, 1, height_ratios=[1, 7])
    draw_split(fig.add_subplot(grid[0]), record.world_size, record.seq_len, record.layout)
    draw_ring_steps(fig.add_subplot(grid[1]), steps, pairs_computed(steps, record.seq_len, record.layout))
    handles = [
        Patch(facecolor=KIND_COLOURS["full"], edgecolor="0.5", label="full"),
        Patch(facecolor=KIND_COLOURS["causal"], edgecolor="0.5", label="diagonal: causal mask"),
        Patch(facecolor=KIND_COLOURS["skip"], edgecolor="0.5", label="skipped"),
    ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=3,
        fontsize=13,
        frameon=False,
        title="a square: query chunk q (row) against key chunk k (column)",
        title_fontsize=12,
    )
    return fig


def describe_ring(record: RingRecord) -> str:
    """The figure's text alternative: the split, then per rank and step the block held and its
    pairs' masks, and the pairs each rank computed."""
    steps = ring_steps(record)
    n = record.world_size
    owners = "; ".join(f"rank {r} holds chunks {cp.chunks_of(r, n, record.layout)}" for r in range(n))
    parts = [
        f"Causal ring attention on {n} ranks, step by step. {record.layout} split of {record.seq_len} positions "
        f"into {cp.chunk_count(n, record.layout)} chunks: {owners}."
    ]
    for row in steps:
        cells = "; ".join(
            f"step {s.step}: K/V of rank {s.source}, "
            + ", ".join(f"q{q}-k{k} {kind}" for (q, k), kind in s.pairs.items())
            for s in row
        )
        parts.append(f"Rank {row[0].rank}: {cells}.")
    parts.append(f"Query-key pairs per rank: {pairs_computed(steps, record.seq_len, record.layout)}.")
    return " ".join(parts)
