"""The capstone's model and data (chapter 11): a small GPT and a task it learns on a CPU in seconds.

The GPT is decoder-only: token and position embeddings, pre-norm blocks of causal self-attention
and MLP, a final LayerNorm and an **untied** output head (its own weights, not the embedding's:
tensor parallelism would silently untie a tied pair). Attention keeps q, k and v as three
Linear layers and infers the number of heads from the width it receives, so that the same code
runs whole or split column-wise over tensor-parallel ranks.

The task is multi-digit addition, ``"12+34=" -> "640"``: the sum, 46, in one digit more than
the numbers, written least significant digit first (the order a carry flows), so that each
answer digit depends on digits already seen.
Only the answer positions count in the loss and in the exact-match accuracy.

With ``GPTConfig(moe_experts=E)`` each block's MLP becomes a mixture of E expert MLPs (MoE): more
parameters, the same computation per token (top_k experts each); the default, 0, is the dense GPT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

PLUS, EQUALS = 10, 11  # token ids; 0-9 are the digits
IGNORE = -100  # target of a position that is not part of the answer (cross_entropy's ignore_index)


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 12
    block_size: int = 16  # the longest sequence the position embedding covers
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    # Mixture of experts: 0 keeps one dense MLP per block; E > 0 puts E expert MLPs and a router there.
    moe_experts: int = 0
    top_k: int = 2
    capacity_factor: float = 1.25


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of (batch, heads, positions, head_dim) tensors on the whole sequence."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q, self.k, self.v = (nn.Linear(cfg.d_model, cfg.d_model) for _ in range(3))
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        # How q, k and v become the heads' outputs: context parallelism puts ring attention here.
        self.attention = causal_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: all of them when whole, this rank's share when q, k, v are split column-wise.
        q, k, v = (lin(x).view(B, T, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = self.attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(C x tokens x k / E). C = 1 is exactly the average load; C >= E / k never drops."""
    return math.ceil(capacity_factor * tokens * top_k / experts)


def route(probs: torch.Tensor, top_k: int, capacity: int):
    """Each token's top_k experts and gates (their router probabilities, not renormalised), each
    choice's slot in its expert's buffer, and whether it is kept: slots are given in token order, all
    first choices before any second choice, and a choice past its expert's capacity is dropped."""
    gates, experts = probs.topk(top_k, dim=-1)
    # (k, N) flattened: every token's first choice, then every token's second.
    one_hot = F.one_hot(experts.t().reshape(-1), probs.shape[-1])
    slots = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
    slots = slots.view(top_k, -1).t()
    return experts, gates, slots, slots < capacity


class Experts(nn.ModuleList):
    """E expert MLPs, applied to their slots (E, capacity, d). Under expert parallelism a rank keeps
    only its own (the others become Identity, the names stay) and local lists them."""

    def __init__(self, cfg: GPTConfig):
        super().__init__(MLP(cfg) for _ in range(cfg.moe_experts))
        self.local = list(range(cfg.moe_experts))

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.stack([self[e](s) for e, s in zip(self.local, slots)])


class MoE(nn.Module):
    """Mixture of experts in place of the MLP: a router picks top_k experts per token, each expert
    computes only the tokens sent to it, up to its capacity; a dropped choice adds 0 (the residual
    carries the token). After forward: routed and dropped choices per expert, and aux_loss (Switch/
    GShard: E x sum_i f_i P_i, f_i the share of choices routed to expert i, P_i its mean probability).
    With a group, the counts cover the tokens of all its ranks and aux_loss is this rank's share of
    the loss over all of them (the shares sum to it: P_i is a sum over tokens)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not 1 <= cfg.top_k <= cfg.moe_experts or not cfg.capacity_factor > 0:
            raise ValueError(f"top_k {cfg.top_k} must be 1 to moe_experts {cfg.moe_experts}, capacity_factor above 0")
        self.cfg, self.group = cfg, None
        self.router = nn.Linear(cfg.d_model, cfg.moe_experts, bias=False)
        self.experts = Experts(cfg)
        self.routed = self.dropped = self.aux_loss = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        (n, d), n_experts, k = tokens.shape, self.cfg.moe_experts, self.cfg.top_k
        probs = self.router(tokens).softmax(-1)
        capacity = expert_capacity(n, n_experts, k, self.cfg.capacity_factor)
        experts, gates, slots, kept = route(probs, k, capacity)
        # Dispatch: each kept choice's token copied into its slot; empty slots stay 0.
        where = (experts * capacity + slots)[kept]
        token = torch.arange(n, device=x.device)[:, None].expand(n, k)[kept]
        buffer = tokens.new_zeros(n_experts * capacity, d).index_copy(0, where, tokens[token])
        out = self.experts(buffer.view(n_experts, capacity, d)).reshape(-1, d)
        # Combine: each token's kept choices, weighted by their gates, summed.
        y = torch.zeros_like(tokens).index_add(0, token, out[where] * gates[kept][:, None])
        routed, dropped = (torch.bincount(e, minlength=n_experts) for e in (experts.flatten(), experts[~kept]))
        counts = torch.cat([routed, dropped, torch.tensor([n], device=x.device)])
        if self.group is not None:
            dist.all_reduce(counts, group=self.group)
        self.routed, self.dropped, total = counts[:n_experts], counts[n_experts:-1], counts[-1]
        self.aux_loss = n_experts * (self.routed / (total * k) * probs.sum(0)).sum() / total
        return y.view(x.shape)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), CausalSelfAttention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MoE(cfg) if cfg.moe_experts else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # untied

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for token ids idx (batch, T); positions are the tokens' places in the sequence,
        0 to T-1 unless given (a context-parallel rank holds some positions of each sequence)."""
        # A pipeline stage keeps only its own layers (the rest set to None, blocks to Identity):
        # the stages after the first receive hidden states, not token ids.
        x = idx
        if self.tok_emb is not None:
            T = idx.shape[1]
            if positions is None:
                if T > self.cfg.block_size:
                    raise ValueError(f"sequence of {T} tokens, longer than block_size {self.cfg.block_size}")
                positions = torch.arange(T, device=idx.device)
            x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            # Checkpointing keeps only each block's input and recomputes the rest in backward.
            x = checkpoint(block, x, use_reentrant=False) if self.activation_checkpointing else block(x)
        return x if self.head is None else self.head(self.ln_f(x))


class AdditionTask:
    """Sums of two ``n_digits``-digit numbers as token sequences: ``a + b = reversed(a + b)``.

    With ``variable_length``, each problem has its own digit count, 1 to ``n_digits``, and a
    shorter problem is padded at its end to the longest length: a causal model never lets the
    padding change an earlier position, and its targets are IGNORE. So the number of answer tokens
    (those the loss counts) differs between problems, micro-batches and ranks.
    """

    def __init__(self, n_digits: int = 2, variable_length: bool = False):
        if n_digits < 1:
            raise ValueError(f"n_digits must be at least 1, got {n_digits}")
        self.n_digits = n_digits
        self.variable_length = variable_length
        self.answer_len = n_digits + 1
        self.seq_len = 3 * n_digits + 2  # the model's input: the sequence without its last token

    def _digits(self, numbers: torch.Tensor, width: int) -> torch.Tensor:
        powers = 10 ** torch.arange(width - 1, -1, -1)
        return numbers[:, None] // powers % 10  # most significant first

    def batch(self, generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` random problems: inputs ``x`` and next-token targets ``y`` (IGNORE outside
        the answer), both of shape (size, seq_len), drawn from ``generator`` alone."""
        if self.variable_length:
            return self._mixed_batch(generator, size)
        a, b = torch.randint(0, 10**self.n_digits, (2, size), generator=generator)
        return self.batch_of(a, b)

    def batch_of(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The problems ``a + b`` (1-d tensors of numbers below 10**n_digits) as ``x`` and ``y``."""
        size = len(a)
        answer = self._digits(a + b, self.answer_len).flip(1)  # least significant digit first
        seq = torch.cat(
            [
                self._digits(a, self.n_digits),
                torch.full((size, 1), PLUS),
                self._digits(b, self.n_digits),
                torch.full((size, 1), EQUALS),
                answer,
            ],
            dim=1,
        )
        x, y = seq[:, :-1], seq[:, 1:].clone()
        y[:, : -self.answer_len] = IGNORE
        return x, y

    def _mixed_batch(self, generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.n_digits
        digits = torch.randint(1, n + 1, (size,), generator=generator)
        # Drawn with n digits and cut to each problem's own: uniform, since 10**d divides 10**n.
        a, b = torch.randint(0, 10**n, (2, size), generator=generator) % 10**digits
        x = torch.full((size, self.seq_len), EQUALS)
        y = torch.full((size, self.seq_len), IGNORE)
        for i, (d, a_i, b_i) in enumerate(zip(digits.tolist(), a.tolist(), b.tolist())):
            problem = AdditionTask(d)
            xi, yi = problem.batch_of(torch.tensor([a_i]), torch.tensor([b_i]))
            x[i, : problem.seq_len], y[i, : problem.seq_len] = xi[0], yi[0]
        return x, y

    def show(self, x: torch.Tensor, answer: torch.Tensor) -> str:
        """One problem as text, with an answer (given least significant digit first)."""
        digits = "".join("0123456789+="[t] for t in x[: 2 * self.n_digits + 2].tolist())
        return digits + "".join(str(d) for d in reversed(answer.tolist()))


def answer_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cross-entropy summed over the answer positions, and how many there are: a sum, so that
    ranks can add theirs before dividing by the global count (a mean of means drifts)."""
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return loss, int((y != IGNORE).sum())


def exact_match(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per problem: is every answer digit the model's most likely token? With the correct digits
    fed back (teacher forcing) this is exactly whether greedy decoding gets the whole sum right."""
    right = (logits.argmax(-1) == y) | (y == IGNORE)
    return right.all(dim=1)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
