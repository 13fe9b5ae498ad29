"""parallel_course.context_parallel: block math, splits and work counts in-process; the ring and
Ulysses in a process group of one (the launch on 4 ranks is chapter 13a's notebook)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel_course import context_parallel as cp


def qkv(T=16, B=2, H=4, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(3)]


def simulated_ring(q, k, v, world_size, layout, rescale=True):
    """The ring's arithmetic without processes: each rank's queries against every rank's keys,
    in the order the ring delivers them (itself, r-1, r-2, ...)."""
    shares = [[cp.split_sequence(t, r, world_size, layout) for t in (q, k, v)] for r in range(world_size)]
    outs = []
    for rank in range(world_size):
        mine = cp.chunks_of(rank, world_size, layout)
        running = [cp.RunningAttention(rescale) for _ in mine]
        for step in range(world_size):
            source = (rank - step) % world_size
            keys = shares[source][1].chunk(len(mine), dim=-2)
            values = shares[source][2].chunk(len(mine), dim=-2)
            for qc, q_i, acc in zip(mine, shares[rank][0].chunk(len(mine), dim=-2), running):
                for kc, k_j, v_j in zip(cp.chunks_of(source, world_size, layout), keys, values):
                    if cp.mask_kind(qc, kc) != "skip":
                        acc.add(cp.block_attention(q_i, k_j, v_j, mask=cp.mask_kind(qc, kc)))
        outs.append(torch.cat([a.out for a in running], dim=-2))
    return cp.unsplit_sequence(outs, layout)


def test_chunks_and_positions():
    assert [cp.chunks_of(r, 4, "zigzag") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [cp.chunks_of(r, 4, "contiguous") for r in range(4)] == [[0], [1], [2], [3]]
    assert cp.positions_of(1, 2, 8, "zigzag").tolist() == [2, 3, 4, 5]
    assert cp.positions_of(0, 2, 8, "zigzag").tolist() == [0, 1, 6, 7]
    with pytest.raises(ValueError, match="does not cut into 4"):
        cp.positions_of(0, 2, 10, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        cp.chunk_count(2, "striped")


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_split_then_unsplit_is_the_identity(layout):
    x = torch.arange(2 * 3 * 16).reshape(2, 3, 16)
    shares = [cp.split_sequence(x, r, 4, layout, dim=-1) for r in range(4)]
    assert torch.equal(cp.unsplit_sequence(shares, layout, dim=-1), x)


def test_mask_kinds():
    assert [cp.mask_kind(2, k) for k in range(4)] == ["full", "full", "causal", "skip"]


def test_blocks_merged_with_their_log_sum_exp_equal_one_softmax():
    q, k, v = qkv(T=12)
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # Query chunk 2 of 3 against key chunks 0, 1 (full) and 2 (its diagonal).
    q2 = q[..., 8:, :]
    acc = cp.RunningAttention()
    for c, kind in ((1, "full"), (2, "causal"), (0, "full")):
        acc.add(cp.block_attention(q2, k[..., 4 * c : 4 * c + 4, :], v[..., 4 * c : 4 * c + 4, :], mask=kind))
    torch.testing.assert_close(acc.out, whole[..., 8:, :])
    scores = (q2 @ k.transpose(-2, -1)) / 8**0.5
    scores[..., 4:].masked_fill_(torch.ones(4, 8, dtype=torch.bool).triu(5), float("-inf"))
    torch.testing.assert_close(acc.lse, torch.logsumexp(scores, -1))


def test_block_attention_refuses_a_skipped_block():
    q, k, v = qkv(T=4)
    with pytest.raises(ValueError, match="mask"):
        cp.block_attention(q, k, v, mask="skip")


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_simulated_ring_equals_sdpa_and_no_rescale_does_not(layout):
    q, k, v = qkv(T=16)
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(simulated_ring(q, k, v, 4, layout), whole)
    assert (simulated_ring(q, k, v, 4, layout, rescale=False) - whole).abs().max() > 0.1


def test_work_per_rank():
    # 16 positions, 4 ranks: chunks of 4 (10 pairs on a diagonal) or 2 (3 pairs) positions.
    assert cp.pairs_per_rank(16, 4, "contiguous") == [10, 26, 42, 58]
    assert cp.pairs_per_rank(16, 4, "zigzag") == [34, 34, 34, 34]
    assert sum(cp.pairs_per_rank(16, 4, "zigzag")) == 16 * 17 // 2


def test_bytes_sent():
    k = torch.zeros(2, 4, 4, 8)
    assert cp.ring_kv_bytes(k, 4) == 3 * 2 * 256 * 4
    assert cp.ulysses_bytes(k, 4) == 4 * 256 * 4 * 3 // 4


@pytest.fixture(scope="module")
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_ring_and_ulysses_in_a_group_of_one(group_of_one, layout):
    q, k, v = (t.requires_grad_() for t in qkv(T=8))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads = torch.autograd.grad(whole.square().sum(), (q, k, v))
    for attention in (lambda *t: cp.ring_attention(*t, layout=layout), cp.ulysses_attention):
        out = attention(q, k, v)
        torch.testing.assert_close(out, whole)
        for got, expected in zip(torch.autograd.grad(out.square().sum(), (q, k, v)), grads):
            torch.testing.assert_close(got, expected)


def test_rotate_in_a_group_of_one_returns_the_tensor_and_its_gradient(group_of_one):
    x = torch.arange(4.0, requires_grad=True)
    y = cp.rotate(x)
    assert torch.equal(y, x.detach())
    y.backward(torch.ones(4))
    assert torch.equal(x.grad, torch.ones(4))


def test_ulysses_refuses_heads_it_cannot_divide(group_of_one, monkeypatch):
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    with pytest.raises(ValueError, match="4 heads do not split evenly over 3"):
        cp.sequence_to_heads(torch.zeros(1, 4, 2, 8))


def test_ring_flash_in_a_group_of_one(group_of_one):
    q, k, v = (t.requires_grad_() for t in qkv(T=8, dtype=torch.float32))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads = torch.autograd.grad(whole.square().sum(), (q, k, v))
    out = cp.ring_flash_attention(q, k, v, block_size=4)
    torch.testing.assert_close(out, whole)
    for got, expected in zip(torch.autograd.grad(out.square().sum(), (q, k, v)), grads):
        torch.testing.assert_close(got, expected)


def ring_flash_on_threads(q, k, v, weight, world_size, layout, gradients_home=True):
    """ring_flash_attention on one thread per rank (parallel_course.slips.simulated_group), forward
    and backward: the whole output and gradients, what each rank saved for backward, the messages."""
    from parallel_course.flash_attention import SavedTensors
    from parallel_course.slips.simulated_group import simulate

    def rank_run(rank):
        mine = [cp.split_sequence(t, rank, world_size, layout).clone().requires_grad_() for t in (q, k, v)]
        with SavedTensors(*mine) as saved:
            out = cp.ring_flash_attention(*mine, layout=layout, block_size=3, gradients_home=gradients_home)
        (out * cp.split_sequence(weight, rank, world_size, layout)).sum().backward()
        return out.detach(), [t.grad for t in mine], saved.bytes

    outcome = simulate(rank_run, [(r,) for r in range(world_size)])
    assert outcome.error is None and outcome.deadlock is None, (outcome.error, outcome.deadlock)
    out = cp.unsplit_sequence([r[0] for r in outcome.results], layout)
    grads = [cp.unsplit_sequence([r[1][i] for r in outcome.results], layout) for i in range(3)]
    return out, grads, [r[2] for r in outcome.results], outcome


@pytest.mark.parametrize("world_size, layout", [(2, "zigzag"), (3, "contiguous"), (3, "zigzag")])
def test_ring_flash_on_simulated_ranks_equals_sdpa_and_keeps_only_its_own(world_size, layout):
    q, k, v = (t.requires_grad_() for t in qkv(T=12 * world_size, dtype=torch.float32))
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = torch.autograd.grad((whole * weight).sum(), (q, k, v))
    out, grads, saved, outcome = ring_flash_on_threads(q.detach(), k.detach(), v.detach(), weight, world_size, layout)
    torch.testing.assert_close(out, whole.detach(), atol=1e-5, rtol=0)
    for got, e in zip(grads, expected):
        torch.testing.assert_close(got, e, atol=1e-5, rtol=0)
    # Saved: its own q, k, v and output (4 shares) and one log-sum-exp per query (a share / head_dim).
    share = q[..., : q.shape[-2] // world_size, :]
    assert saved == [share.numel() * 4 * (4 + 1 / 8)] * world_size
    # Each rank sends its K/V N-1 times in forward, again in backward, and the gradients N times.
    for rank in range(world_size):
        sent = [m.numel for m in outcome.sent(rank)]
        assert sent == [2 * share.numel()] * (3 * world_size - 2)
        assert {m.dst for m in outcome.sent(rank)} == {(rank + 1) % world_size}


def test_ring_flash_whose_gradients_miss_their_last_hop_is_caught():
    q, k, v = qkv(T=8, dtype=torch.float32)
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    _, right, _, _ = ring_flash_on_threads(q, k, v, weight, 2, "zigzag")
    _, wrong, _, _ = ring_flash_on_threads(q, k, v, weight, 2, "zigzag", gradients_home=False)
    torch.testing.assert_close(wrong[0], right[0])
    assert (wrong[1] - right[1]).abs().max() > 1e-2 and (wrong[2] - right[2]).abs().max() > 1e-2
