"""parallel_course.loss_memory: the chunked cross-entropy equals the full one (loss and gradients),
its peak memory is the inputs, their gradients and two chunks' logits (divided by the chunk count),
and without recomputation it keeps every chunk's log-probabilities (the negative control); the
vocabulary-parallel loss by hand in a group of one, and its negative control on simulated ranks."""

import functools
import threading

import pytest
import torch
import torch.distributed as dist

from parallel_course.gpt import IGNORE
from parallel_course.loss_memory import chunked_cross_entropy, cross_entropy_sum, vocab_parallel_cross_entropy
from parallel_course.memory_tracking import tracked

N, D, V = 96, 8, 256


def problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g, requires_grad=True)
    weight = (torch.randn(V, D, generator=g) * 0.3).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=g)
    targets[::5] = IGNORE
    return hidden, weight, targets


def peak_of(loss_fn, hidden, weight, targets):
    def run():
        loss = loss_fn(hidden, weight, targets)
        return loss.detach(), torch.autograd.grad(loss, (hidden, weight))

    return tracked(run, hidden, weight, targets)


@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_chunked_equals_the_full_loss_and_its_gradients(chunks):
    hidden, weight, targets = problem()
    (full, full_grads), _ = peak_of(cross_entropy_sum, hidden, weight, targets)
    (loss, grads), _ = peak_of(functools.partial(chunked_cross_entropy, chunks=chunks), hidden, weight, targets)
    torch.testing.assert_close(loss, full)
    for got, expected in zip(grads, full_grads):
        torch.testing.assert_close(got, expected)


def test_peak_is_two_chunks_of_logits_above_inputs_and_gradients():
    hidden, weight, targets = problem()
    inputs = 4 * (N * D + V * D) + 8 * N
    gradients = 4 * (N * D + V * D)
    logits = 4 * N * V
    _, full = peak_of(cross_entropy_sum, hidden, weight, targets)
    # The full loss: its logits, the log-probabilities it keeps, and one more in backward (the
    # gradients of the inputs are made after), and two scalars (the loss and its gradient).
    assert full["Total"] == inputs + 3 * logits + 8
    for chunks in (2, 4, 8):
        _, chunked = peak_of(functools.partial(chunked_cross_entropy, chunks=chunks), hidden, weight, targets)
        assert chunked["Total"] == inputs + gradients + 2 * logits // chunks + 8
        # The negative control: the chunks through plain autograd keep every chunk's log-probabilities.
        _, kept = peak_of(
            functools.partial(chunked_cross_entropy, chunks=chunks, recompute=False), hidden, weight, targets
        )
        assert kept["Total"] - inputs - gradients > logits


def test_chunks_must_be_positive():
    with pytest.raises(ValueError, match="chunks"):
        chunked_cross_entropy(*problem(), 0)


def test_vocab_parallel_by_hand_in_a_group_of_one_and_split_on_threads():
    g = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(N, 12, generator=g), torch.randint(0, 12, (N,), generator=g)
    targets[::4] = IGNORE
    expected = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.testing.assert_close(vocab_parallel_cross_entropy(logits, targets, 0), expected)
    finally:
        dist.destroy_process_group()

    # Two ranks of six entries each, on two threads whose all-reduces meet at a barrier.
    for reduce_normalizer, equal in ((True, True), (False, False)):
        results = two_ranks(
            lambda rank, r=reduce_normalizer: vocab_parallel_cross_entropy(
                logits[:, 6 * rank : 6 * rank + 6], targets, 6 * rank, reduce_normalizer=r
            )
        )
        # Reduced, both ranks hold the loss; each rank's own normaliser gives each a wrong one.
        assert all(torch.allclose(r, expected, atol=1e-4) == equal for r in results), (results, expected)


def two_ranks(run):
    """run(rank) on two threads, dist.all_reduce replaced by one that meets the other thread."""
    barrier, slots, local = threading.Barrier(2), [None, None], threading.local()

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None):
        slots[local.rank] = t.clone()
        barrier.wait()
        total = torch.maximum(*slots) if op == dist.ReduceOp.MAX else slots[0] + slots[1]
        barrier.wait()
        t.copy_(total)

    results = [None, None]

    def thread(rank):
        local.rank = rank
        results[rank] = run(rank)

    original, dist.all_reduce = dist.all_reduce, all_reduce
    try:
        threads = [threading.Thread(target=thread, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        dist.all_reduce = original
    return results
