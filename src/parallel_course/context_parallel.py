"""Context parallelism by hand (chapter 13a): attention over a sequence split between ranks.

Two ways, both checked against ``F.scaled_dot_product_attention(is_causal=True)`` on the whole
sequence:

- **Ring attention.** Each rank keeps its queries; the keys and values travel around the ring,
  one rank further per step (``rotate``, an autograd Function: its backward sends the gradients
  the other way). Each arriving block gives a partial result, its output and the log-sum-exp of
  its scores, and a running accumulator (``RunningAttention``) folds it in with the rescale that
  makes the blocks' softmaxes one softmax over every key seen.
- **Ulysses.** An all-to-all turns "my positions, every head" into "every position, my heads",
  whole-sequence attention runs on H/N heads, and a second all-to-all turns it back.

The ring above keeps, for backward, every key/value block it received (autograd saves them):
the whole sequence's K and V on every rank. ``ring_flash_attention`` (chapter 16, and the
capstone's ``--parallel cp``) is the ring as published and as torch runs it: an autograd Function
built on ``parallel_course.flash_attention`` that keeps only the rank's own q, k, v, output and
log-sum-exp, and sends K and V round again in backward, their gradients travelling home with them.

Causal masking is decided per block pair from the chunks' global places: a key chunk after the
query chunk is skipped, the same chunk is masked on its diagonal, an earlier chunk is attended to
in full. With a contiguous split the last rank does most of the work; the zig-zag split (rank r
holds chunks r and 2N-1-r of 2N) gives every rank the same amount.

Tensors are (batch, heads, positions, head_dim), as SDPA takes them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .flash_attention import flash_backward, flash_forward

LAYOUTS = ("contiguous", "zigzag")


# --- which chunks a rank holds -------------------------------------------------------------------


def chunk_count(world_size: int, layout: str) -> int:
    """How many equal chunks the sequence is cut into: one per rank, or two with zig-zag."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return 2 * world_size if layout == "zigzag" else world_size


def chunks_of(rank: int, world_size: int, layout: str) -> list[int]:
    """The global chunk numbers rank holds, in order: [r], or [r, 2N-1-r] with zig-zag."""
    chunk_count(world_size, layout)
    return [rank, 2 * world_size - 1 - rank] if layout == "zigzag" else [rank]


def positions_of(rank: int, world_size: int, seq_len: int, layout: str) -> torch.Tensor:
    """The global positions of rank's tokens, in the order it holds them."""
    n = chunk_count(world_size, layout)
    if seq_len % n:
        raise ValueError(f"a sequence of {seq_len} positions does not cut into {n} equal chunks")
    size = seq_len // n
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks_of(rank, world_size, layout)])


def split_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str, dim: int = -2) -> torch.Tensor:
    """Rank's share of x along dim (the positions)."""
    index = positions_of(rank, world_size, x.shape[dim], layout).to(x.device)
    return x.index_select(dim, index)


def unsplit_sequence(shares: list[torch.Tensor], layout: str, dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's share (in rank order): the inverse of split_sequence."""
    world_size = len(shares)
    n = chunk_count(world_size, layout)
    pieces: list[torch.Tensor | None] = [None] * n
    for rank, share in enumerate(shares):
        mine = chunks_of(rank, world_size, layout)
        for c, piece in zip(mine, share.chunk(len(mine), dim=dim)):
            pieces[c] = piece
    return torch.cat(pieces, dim=dim)


# --- one block pair ------------------------------------------------------------------------------


def mask_kind(query_chunk: int, key_chunk: int) -> str:
    """Causal attention between two equal chunks: "skip" (keys after every query), "causal"
    (the same positions: mask above the diagonal) or "full" (keys before every query)."""
    if key_chunk > query_chunk:
        return "skip"
    return "causal" if key_chunk == query_chunk else "full"


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a query block to one key/value block: the output, normalised over these keys
    only, and the log-sum-exp of each query's scores (what the block's softmax divided by, as a
    log). mask is "full" or "causal" (query i sees keys 0..i of the block)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if mask == "causal":
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    elif mask != "full":
        raise ValueError(f"mask must be 'full' or 'causal', got {mask!r}")
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


class RunningAttention:
    """The output and log-sum-exp over the key blocks added so far (an online softmax).

    Each block's output is normalised over its own keys. Folding one in: the new log-sum-exp is
    log(e^lse + e^lse_block); each side is weighted by its share of the total, e^(lse_side - new).
    With rescale=False the blocks are averaged with equal weights instead: the mistake of taking
    each block's softmax as if it covered every key (the negative control).
    """

    def __init__(self, rescale: bool = True):
        self.rescale = rescale
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None
        self.blocks = 0

    def add(self, block: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Fold in one block's (output, log-sum-exp), as block_attention returns them."""
        out, lse = block
        self.blocks += 1
        if self.out is None:
            self.out, self.lse = out, lse
        elif self.rescale:
            total = torch.logaddexp(self.lse, lse)
            self.out = self.out * torch.exp(self.lse - total).unsqueeze(-1) + out * torch.exp(lse - total).unsqueeze(-1)
            self.lse = total
        else:
            self.out = self.out + (out - self.out) / self.blocks


# --- the ring ------------------------------------------------------------------------------------


def shift(x: torch.Tensor, group=None, step: int = 1) -> torch.Tensor:
    """Send x to the rank `step` places on (in the group, around the ring) and return what arrives
    from the rank `step` places back: a send and a receive batched (nccl needs them together)."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    # A ring of one: the tensor comes back to its sender (gloo cannot send to itself).
    if world_size == 1:
        return x.clone()
    x = x.contiguous()
    received = torch.empty_like(x)
    ops = [
        dist.P2POp(dist.isend, x, group=group, group_peer=(rank + step) % world_size),
        dist.P2POp(dist.irecv, received, group=group, group_peer=(rank - step) % world_size),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


class Rotate(torch.autograd.Function):
    """One ring step: forward passes a tensor to the next rank (receiving the previous rank's);
    backward passes the gradient back to the rank it came from (receiving the next rank's)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return shift(x, group, +1)

    @staticmethod
    def backward(ctx, grad):
        return shift(grad, ctx.group, -1), None


def rotate(x: torch.Tensor, group=None) -> torch.Tensor:
    """x passed one rank on around the ring, differentiably."""
    return Rotate.apply(x, group)


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, layout: str = "zigzag", rescale: bool = True
) -> torch.Tensor:
    """Causal attention of this rank's queries to every earlier position of the whole sequence.

    q, k, v hold this rank's positions (split_sequence with the same layout). In N steps, this
    rank sees the keys and values of itself, then of rank r-1, r-2, ...: each of its query chunks
    attends to each arriving key chunk that is not after it, and keeps a running result.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    mine = chunks_of(rank, world_size, layout)
    queries = q.chunk(len(mine), dim=-2)
    running = [RunningAttention(rescale) for _ in mine]
    # Keys and values travel together: one message per step.
    kv = torch.stack([k, v])
    for step in range(world_size):
        source = (rank - step) % world_size
        keys, values = kv[0].chunk(len(mine), dim=-2), kv[1].chunk(len(mine), dim=-2)
        for q_chunk, q_i, acc in zip(mine, queries, running):
            for k_chunk, k_j, v_j in zip(chunks_of(source, world_size, layout), keys, values):
                kind = mask_kind(q_chunk, k_chunk)
                if kind != "skip":
                    acc.add(block_attention(q_i, k_j, v_j, mask=kind))
        if step < world_size - 1:
            kv = rotate(kv, group)
    # Every rank must run every ring step's backward (it sends and receives gradients there). A
    # rank that used none of the last keys it received (the first ranks of a contiguous split)
    # would skip those steps and leave its neighbours waiting: a zero-weighted use keeps them.
    return torch.cat([acc.out for acc in running], dim=-2) + 0 * kv.sum()


def ring_flash_forward(q, k, v, group, layout: str, block_size: int):
    """Ring-flash's forward: this rank's output and log-sum-exp, the blocks computed with
    FlashAttention's tiles as they arrive and merged (RunningAttention), each received block let go
    once passed on."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    mine = chunks_of(rank, world_size, layout)
    running = [RunningAttention() for _ in mine]
    kv = torch.stack([k, v])
    for step in range(world_size):
        source = (rank - step) % world_size
        keys, values = kv[0].chunk(len(mine), dim=-2), kv[1].chunk(len(mine), dim=-2)
        for q_chunk, q_i, acc in zip(mine, q.chunk(len(mine), dim=-2), running):
            for k_chunk, k_j, v_j in zip(chunks_of(source, world_size, layout), keys, values):
                kind = mask_kind(q_chunk, k_chunk)
                if kind != "skip":
                    out, lse, _ = flash_forward(q_i, k_j, v_j, causal=kind == "causal", block_size=block_size)
                    acc.add((out, lse))
        if step < world_size - 1:
            kv = shift(kv, group, +1)
    # In q's memory layout, as SDPA returns it: the heads' outputs side by side for each position,
    # so the projection after attention takes a view of it, not a second copy.
    out = torch.empty_like(q).copy_(torch.cat([acc.out for acc in running], dim=-2))
    return out, torch.cat([acc.lse for acc in running], dim=-1)


def ring_flash_backward(q, k, v, out, lse, grad_out, group, layout: str, block_size: int, gradients_home: bool = True):
    """Ring-flash's backward: dq, dk, dv of this rank's share. The keys and values go round the
    ring again; against each arriving block this rank's queries recompute their probabilities
    (flash_backward, from the saved log-sum-exp) and add their part of the block's dK and dV to the
    gradients that travel with it. After N hops the gradients are back with their owner."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    mine = chunks_of(rank, world_size, layout)
    n = len(mine)
    # D = rowsum(dO * O), once per query, over the whole attention.
    delta = (grad_out * out).sum(-1)
    dq = torch.zeros_like(q)
    queries = list(
        zip(mine, q.chunk(n, -2), grad_out.chunk(n, -2), lse.chunk(n, -1), delta.chunk(n, -1), dq.chunk(n, -2))
    )
    kv = torch.stack([k, v])
    dkv = torch.zeros_like(kv)
    for step in range(world_size):
        source = (rank - step) % world_size
        blocks = zip(chunks_of(source, world_size, layout), *(t.chunk(n, -2) for t in (*kv, *dkv)))
        for k_chunk, k_j, v_j, dk_j, dv_j in blocks:
            for q_chunk, q_i, do_i, lse_i, delta_i, dq_i in queries:
                kind = mask_kind(q_chunk, k_chunk)
                if kind != "skip":
                    grads = flash_backward(
                        q_i, k_j, v_j, None, lse_i, do_i, causal=kind == "causal", block_size=block_size, delta=delta_i
                    )
                    for into, grad in zip((dq_i, dk_j, dv_j), grads):
                        into += grad
        if step < world_size - 1:
            kv = shift(kv, group, +1)
        # The last hop takes each block's gradients home (left out: the negative control).
        if step < world_size - 1 or gradients_home:
            dkv = shift(dkv, group, +1)
    return dq, dkv[0], dkv[1]


class RingFlashAttention(torch.autograd.Function):
    """Ring attention that saves for backward only this rank's q, k, v, output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout, block_size, gradients_home):
        out, lse = ring_flash_forward(q, k, v, group, layout, block_size)
        ctx.args = (group, layout, block_size, gradients_home)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        return *ring_flash_backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.args), None, None, None, None


def ring_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group=None,
    layout: str = "zigzag",
    block_size: int = 128,
    gradients_home: bool = True,
) -> torch.Tensor:
    """Causal ring attention as published (Liu et al.) and as torch's own ring runs it: the same
    ring and merge as ring_attention, each block pair computed with FlashAttention's tiles
    (parallel_course.flash_attention), but an autograd Function that keeps for backward only this
    rank's q, k, v, its output and log-sum-exp. Its backward sends the keys and values round the
    ring again, each rank recomputing its queries' probabilities against every block it receives,
    and the blocks' gradients travel with them back to their owners: N-1 more hops of K and V and
    N hops of their gradients, in exchange for the received blocks' memory."""
    return RingFlashAttention.apply(q, k, v, group, layout, block_size, gradients_home)


def pairs_per_rank(seq_len: int, world_size: int, layout: str) -> list[int]:
    """Query-key pairs each rank's ring attention computes (the causal ones: masked entries of a
    diagonal block do not count): the work per rank."""
    n = chunk_count(world_size, layout)
    size = seq_len // n
    cost = {"skip": 0, "causal": size * (size + 1) // 2, "full": size * size}
    return [
        sum(cost[mask_kind(q, key)] for q in chunks_of(rank, world_size, layout) for key in range(n))
        for rank in range(world_size)
    ]


def ring_kv_bytes(k: torch.Tensor, world_size: int) -> int:
    """Bytes each rank sends in one ring attention: its keys and values (k's shape and type, one
    rank's share), N-1 times."""
    return (world_size - 1) * 2 * k.numel() * k.element_size()


# --- Ulysses -------------------------------------------------------------------------------------


class AllToAll(torch.autograd.Function):
    """all_to_all_single with equal pieces along dim 0: piece j goes to rank j, and piece j of the
    result came from rank j. Its backward is the same exchange of the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # Contiguous first: empty_like keeps a view's strides, and the exchange writes flat memory.
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def sequence_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, H, T/N, D), this rank's positions of every head -> (B, H/N, T, D), every position of
    this rank's heads (rank j gets heads j*H/N to (j+1)*H/N - 1). The split must be contiguous."""
    world_size = dist.get_world_size(group)
    B, H, T_local, D = x.shape
    if H % world_size:
        raise ValueError(
            f"Ulysses gives each of {world_size} ranks whole heads: {H} heads do not split evenly over {world_size}"
        )
    pieces = x.reshape(B, world_size, H // world_size, T_local, D).transpose(0, 1)
    received = AllToAll.apply(pieces, group)
    # received[j]: rank j's positions (chunk j) of this rank's heads.
    return received.permute(1, 2, 0, 3, 4).reshape(B, H // world_size, world_size * T_local, D)


def heads_to_sequence(y: torch.Tensor, group=None) -> torch.Tensor:
    """The inverse of sequence_to_heads: (B, H/N, T, D) -> (B, H, T/N, D)."""
    world_size = dist.get_world_size(group)
    B, h, T, D = y.shape
    pieces = y.reshape(B, h, world_size, T // world_size, D).permute(2, 0, 1, 3, 4)
    received = AllToAll.apply(pieces, group)
    # received[j]: rank j's heads for this rank's positions.
    return received.transpose(0, 1).reshape(B, world_size * h, T // world_size, D)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None) -> torch.Tensor:
    """Causal attention with the sequence split contiguously: one all-to-all brings q, k and v
    (stacked) to whole sequences of H/N heads, SDPA runs on them, one all-to-all brings the output
    back to this rank's positions."""
    B = q.shape[0]
    qkv = sequence_to_heads(torch.cat([q, k, v]), group)
    y = F.scaled_dot_product_attention(*qkv.split(B), is_causal=True)
    return heads_to_sequence(y, group)


def ulysses_bytes(q: torch.Tensor, world_size: int) -> int:
    """Bytes each rank sends in one Ulysses attention: q, k, v out and the output back (q's shape
    and type, one rank's share), each all-to-all keeping 1/N of it at home."""
    return 4 * q.numel() * q.element_size() * (world_size - 1) // world_size
