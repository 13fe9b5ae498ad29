"""FlashAttention by hand (chapter 16): attention over tiles that never keeps the s x s scores.

Attention's textbook form, ``softmax(q kᵀ / √d) v`` (``naive_attention``), computes every score of
a (queries x keys) square and autograd keeps the probabilities for backward: s² numbers per head.
FlashAttention (Dao et al., 2022; the loop order of FlashAttention-2, Dao, 2023) computes the same
function over tiles of ``block_size`` queries by ``block_size`` keys:

- **forward** (``flash_forward``): for each query tile, the key tiles one after the other with the
  online softmax of chapter 13a: a running maximum m, a running sum l of e^(score - m) and a
  running output, each rescaled by e^(m_old - m_new) when the maximum grows. At the end the output
  is divided by l, and the tile's **log-sum-exp** m + log l is kept: one number per query.
- **backward** (``flash_backward``): the probabilities of each tile recomputed from the scores and
  the log-sum-exp, P = e^(score - lse) (exact: lse is the log of the whole row's normaliser), then
  dV += Pᵀ dO, dP = dO Vᵀ, dS = P (dP - D) with D = rowsum(dO ∘ O), dQ += dS K / √d and
  dK += dSᵀ Q / √d.

``FlashAttention`` (a ``torch.autograd.Function``) saves only q, k, v, the output and the
log-sum-exp: bytes linear in the sequence. With ``backward_with="max"`` its backward recomputes
the probabilities from the forward's running maximum instead of the log-sum-exp (the negative
control: e^(score - m) is a softmax's numerator without its sum, and the gradients come out wrong).

Causal masking is decided per tile (``tile_kind``): a key tile after the query tile is skipped, a
tile that straddles the diagonal is masked inside, one before it is used whole. The last tile of a
sequence that ``block_size`` does not divide is shorter. Tensors are (batch, heads, positions,
head_dim), as ``F.scaled_dot_product_attention`` takes them.
"""

from __future__ import annotations

import torch

BACKWARDS = ("lse", "max")


def tile_kind(q_start: int, q_end: int, k_start: int, k_end: int, causal: bool) -> str:
    """How causal attention treats the tile of queries [q_start, q_end) by keys [k_start, k_end):
    "skip" (every key after every query), "full" (every key at or before every query) or "causal"
    (the diagonal crosses it: mask the keys after each query). Without causal masking, "full"."""
    if not causal or k_end - 1 <= q_start:
        return "full"
    return "skip" if k_start > q_end - 1 else "causal"


def tile_grid(seq_len: int, block_size: int, causal: bool) -> list[list[str]]:
    """Every tile's kind, a row per query tile and a column per key tile (what the figure draws)."""
    if seq_len < 1 or block_size < 1:
        raise ValueError(f"seq_len and block_size must be at least 1, got {seq_len} and {block_size}")
    starts = range(0, seq_len, block_size)
    return [
        [tile_kind(q, min(q + block_size, seq_len), k, min(k + block_size, seq_len), causal) for k in starts]
        for q in starts
    ]


def _scores(q_tile, k_tile, q_start, k_start, kind, scale):
    """One tile's scores, masked above the diagonal when it straddles it."""
    s = (q_tile @ k_tile.transpose(-2, -1)) * scale
    if kind == "causal":
        rows = torch.arange(q_start, q_start + q_tile.shape[-2], device=s.device)[:, None]
        cols = torch.arange(k_start, k_start + k_tile.shape[-2], device=s.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


def _check(q, k, v, causal: bool, block_size: int) -> None:
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: (batch, heads, positions, dim)")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("causal attention here takes as many queries as keys (the same positions)")


@torch.no_grad()
def flash_forward(q, k, v, *, causal: bool, block_size: int):
    """The output, its log-sum-exp per query and the running maximum the forward ended with, computed
    tile by tile with the online softmax (nothing of size queries x keys is ever whole)."""
    _check(q, k, v, causal, block_size)
    scale = q.shape[-1] ** -0.5
    n_q, n_k = q.shape[-2], k.shape[-2]
    out, lse, row_max = torch.empty_like(q), q.new_empty(q.shape[:-1]), q.new_empty(q.shape[:-1])
    for qs in range(0, n_q, block_size):
        qe = min(qs + block_size, n_q)
        q_tile = q[..., qs:qe, :]
        m = q.new_full(q_tile.shape[:-1], float("-inf"))
        total = q.new_zeros(q_tile.shape[:-1])
        acc = torch.zeros_like(q_tile)
        for ks in range(0, n_k, block_size):
            ke = min(ks + block_size, n_k)
            kind = tile_kind(qs, qe, ks, ke, causal)
            if kind == "skip":
                continue
            s = _scores(q_tile, k[..., ks:ke, :], qs, ks, kind, scale)
            m_new = torch.maximum(m, s.amax(-1))
            # What was summed so far was relative to the old maximum: rescale it to the new one.
            rescale = torch.exp(m - m_new)
            p = torch.exp(s - m_new.unsqueeze(-1))
            total = total * rescale + p.sum(-1)
            acc = acc * rescale.unsqueeze(-1) + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc / total.unsqueeze(-1)
        lse[..., qs:qe] = m + torch.log(total)
        row_max[..., qs:qe] = m
    return out, lse, row_max


@torch.no_grad()
def flash_backward(q, k, v, out, lse, grad_out, *, causal: bool, block_size: int, delta=None):
    """dq, dk, dv from the probabilities recomputed tile by tile: P = e^(score - lse). ``delta``,
    rowsum(dO ∘ O), defaults to this output's; a ring passes the whole attention's."""
    _check(q, k, v, causal, block_size)
    scale = q.shape[-1] ** -0.5
    n_q, n_k = q.shape[-2], k.shape[-2]
    if delta is None:
        delta = (grad_out * out).sum(-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, n_k, block_size):
        ke = min(ks + block_size, n_k)
        k_tile, v_tile = k[..., ks:ke, :], v[..., ks:ke, :]
        for qs in range(0, n_q, block_size):
            qe = min(qs + block_size, n_q)
            kind = tile_kind(qs, qe, ks, ke, causal)
            if kind == "skip":
                continue
            q_tile, do_tile = q[..., qs:qe, :], grad_out[..., qs:qe, :]
            p = torch.exp(_scores(q_tile, k_tile, qs, ks, kind, scale) - lse[..., qs:qe].unsqueeze(-1))
            dv[..., ks:ke, :] += p.transpose(-2, -1) @ do_tile
            dp = do_tile @ v_tile.transpose(-2, -1)
            ds = p * (dp - delta[..., qs:qe].unsqueeze(-1))
            dq[..., qs:qe, :] += (ds @ k_tile) * scale
            dk[..., ks:ke, :] += (ds.transpose(-2, -1) @ q_tile) * scale
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention whose forward saves q, k, v, the output and one statistic per query (the
    log-sum-exp; the running maximum with backward_with="max", the negative control), and whose
    backward recomputes the probabilities tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, causal, block_size, backward_with):
        out, lse, row_max = flash_forward(q, k, v, causal=causal, block_size=block_size)
        ctx.causal, ctx.block_size = causal, block_size
        ctx.save_for_backward(q, k, v, out, lse if backward_with == "lse" else row_max)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, statistic = ctx.saved_tensors
        dq, dk, dv = flash_backward(
            q, k, v, out, statistic, grad_out.contiguous(), causal=ctx.causal, block_size=ctx.block_size
        )
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, *, causal: bool, block_size: int, backward_with: str = "lse") -> torch.Tensor:
    """softmax(q kᵀ / √d) v over tiles of block_size x block_size, causal or not, differentiable.
    backward_with="max" is the negative control (see the module's docstring)."""
    if backward_with not in BACKWARDS:
        raise ValueError(f"backward_with must be one of {BACKWARDS}, got {backward_with!r}")
    return FlashAttention.apply(q, k, v, causal, block_size, backward_with)


def naive_attention(q, k, v, *, causal: bool) -> torch.Tensor:
    """The textbook attention with plain autograd: it keeps the probabilities, queries x keys per head."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class SavedTensors:
    """While open, the tensors autograd saves for backward (saved_tensors_hooks), each storage once:
    their bytes, and those of the storages that are none of ``inputs`` (the inputs themselves, and
    views of them, kept by every method alike)."""

    def __init__(self, *inputs: torch.Tensor):
        self.inputs = {t.untyped_storage().data_ptr() for t in inputs}
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    @property
    def beyond_inputs(self) -> int:
        return sum(n for ptr, n in self.storages.items() if ptr not in self.inputs)


def saved_bytes(attention, q, k, v) -> dict[str, int]:
    """What one attention call saves for backward: ``total`` bytes, and ``beyond_inputs`` (not q, k, v)."""
    with SavedTensors(q, k, v) as saved:
        attention(q, k, v)
    return {"total": saved.bytes, "beyond_inputs": saved.beyond_inputs}
