"""The loss's memory (chapter 16): the logits, positions x vocabulary, are the largest activation of
a model whose vocabulary is much wider than its hidden size (Llama 3: 128,256 against 4,096).

- ``cross_entropy_sum``: the plain loss, ``F.cross_entropy(hidden @ weightᵀ)`` summed over the
  positions whose target is not ``IGNORE``. Autograd keeps the log-probabilities (positions x
  vocabulary, fp32) from forward to backward, and backward makes two more tensors of that size.
- ``chunked_cross_entropy``: the same sum over ``chunks`` slices of the positions, as an autograd
  Function (``ChunkedCrossEntropy``) that saves only its inputs: each chunk's logits are computed,
  turned into its loss and dropped in forward, and **recomputed in backward**, one chunk at a time,
  so that at most one chunk's logits exist at once (what Liger-Kernel's fused linear cross-entropy
  and torchtune's chunked loss are built on). With ``recompute=False`` the chunks run through
  plain autograd instead (the negative control): every chunk's log-probabilities are kept, the
  whole logits' worth, and chunking saved nothing.
- ``vocab_parallel_cross_entropy``: the loss of logits split by vocabulary over tensor-parallel
  ranks, by hand, as Megatron-LM computes it and ``torch.distributed.tensor.parallel.loss_parallel``
  does inside: the row maximum, the sum of exponentials and the target's logit each all-reduced
  (three small collectives per position, never the logits). With ``reduce_normalizer=False`` each
  rank's softmax divides by its own shard's sum (the negative control).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .gpt import IGNORE


def cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The head and the loss as one layer: hidden (positions, d) @ weight (vocabulary, d)ᵀ, then the
    cross-entropy summed over the positions whose target is not IGNORE."""
    return F.cross_entropy(hidden @ weight.T, targets, ignore_index=IGNORE, reduction="sum")


class ChunkedCrossEntropy(torch.autograd.Function):
    """cross_entropy_sum over chunks of positions; saves only its inputs and recomputes each chunk's
    logits in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunks):
        total = hidden.new_zeros(())
        for h, y in zip(hidden.chunk(chunks), targets.chunk(chunks)):
            total += cross_entropy_sum(h, weight, y)
        ctx.chunks = chunks
        ctx.save_for_backward(hidden, weight, targets)
        return total

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
        for h, y, dh in zip(hidden.chunk(ctx.chunks), targets.chunk(ctx.chunks), grad_hidden.chunk(ctx.chunks)):
            _chunk_backward(h, weight, y, grad, dh, grad_weight)
        return grad_hidden, grad_weight, None, None


def _chunk_backward(h, weight, y, grad, grad_h, grad_weight) -> None:
    """One chunk's share of the gradients, written into grad_h and added to grad_weight: the
    gradient of a summed cross-entropy by the logits is softmax - one_hot(target), 0 where ignored.
    A function of its own so that the chunk's probabilities are freed when it returns."""
    probs = torch.softmax(h @ weight.T, dim=-1)
    kept = y != IGNORE
    probs[kept, y[kept]] -= 1
    probs[~kept] = 0
    probs *= grad
    torch.mm(probs, weight, out=grad_h)
    grad_weight.addmm_(probs.T, h)


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int, recompute: bool = True
) -> torch.Tensor:
    """cross_entropy_sum over ``chunks`` slices of the positions, each chunk's logits recomputed in
    backward; ``recompute=False``, the negative control, keeps every chunk's log-probabilities."""
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    if recompute:
        return ChunkedCrossEntropy.apply(hidden, weight, targets, chunks)
    return sum(cross_entropy_sum(h, weight, y) for h, y in zip(hidden.chunk(chunks), targets.chunk(chunks)))


@torch.no_grad()
def vocab_parallel_cross_entropy(
    local_logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, group=None, reduce_normalizer: bool = True
) -> torch.Tensor:
    """The summed cross-entropy of logits split by vocabulary: local_logits (positions, V/t) are this
    rank's vocabulary entries vocab_start..vocab_start + V/t - 1. Per position: the maximum
    (all-reduced, for a stable exponential), the sum of e^(logit - max) (all-reduced: the softmax's
    normaliser over the whole vocabulary), and the target's logit (held by one rank, all-reduced as a
    sum with the others' zeros). Forward only: it shows what loss_parallel computes."""
    local_logits = local_logits.float()
    row_max = local_logits.amax(-1)
    dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    shifted = local_logits - row_max.unsqueeze(-1)
    normaliser = shifted.exp().sum(-1)
    if reduce_normalizer:
        dist.all_reduce(normaliser, group=group)
    kept = targets != IGNORE
    local_target = targets - vocab_start
    mine = kept & (local_target >= 0) & (local_target < local_logits.shape[-1])
    target_logit = torch.zeros_like(row_max)
    target_logit[mine] = shifted[mine, local_target[mine]]
    dist.all_reduce(target_logit, group=group)
    return (normaliser.log() - target_logit)[kept].sum()
