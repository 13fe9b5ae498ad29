"""parallel_course.flash_attention: FlashAttention by hand equals SDPA (outputs and gradients, causal
and not, a sequence its tiles do not divide), saves bytes linear in the sequence where the naive
version saves s x s, and its negative control (the backward from the running maximum) is caught;
and the figures of chapter 16 drawn from its data."""

import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parallel_course import memory_figures
from parallel_course.flash_attention import (
    flash_attention,
    flash_forward,
    naive_attention,
    saved_bytes,
    tile_grid,
    tile_kind,
)


def qkv(T=37, B=2, H=3, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g).requires_grad_() for _ in range(3)]


def outputs_and_grads(attention, q, k, v, weight):
    out = attention(q, k, v)
    return [out.detach(), *torch.autograd.grad((out * weight).sum(), (q, k, v))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [8, 64])
def test_equals_sdpa_outputs_and_gradients_within_1e_5(causal, block_size):
    q, k, v = qkv()
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    expected = outputs_and_grads(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal), q, k, v, weight)
    got = outputs_and_grads(lambda *t: flash_attention(*t, causal=causal, block_size=block_size), q, k, v, weight)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_the_backward_from_the_running_maximum_is_wrong_and_caught(causal):
    q, k, v = qkv()
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    right = outputs_and_grads(lambda *t: flash_attention(*t, causal=causal, block_size=8), q, k, v, weight)
    wrong = outputs_and_grads(
        lambda *t: flash_attention(*t, causal=causal, block_size=8, backward_with="max"), q, k, v, weight
    )
    # The forward is the same; every gradient is far off.
    torch.testing.assert_close(wrong[0], right[0])
    assert all((w - r).abs().max() > 1e-2 for w, r in zip(wrong[1:], right[1:]))


def test_the_log_sum_exp_is_the_rows_and_the_maximum_is_the_largest_score():
    q, k, v = (t.detach() for t in qkv(T=10))
    _, lse, row_max = flash_forward(q, k, v, causal=True, block_size=4)
    scores = (q @ k.transpose(-2, -1)) / 8**0.5
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    torch.testing.assert_close(row_max, scores.amax(-1))


def test_saved_bytes_linear_for_flash_quadratic_for_naive():
    B, H, D = 1, 2, 16
    for s in (32, 64, 128):
        q, k, v = (torch.zeros(B, H, s, D, requires_grad=True) for _ in range(3))
        flash = saved_bytes(lambda *t: flash_attention(*t, causal=True, block_size=16), q, k, v)
        naive = saved_bytes(lambda *t: naive_attention(*t, causal=True), q, k, v)
        # Flash: q, k, v, then the output and one log-sum-exp per query, float32.
        assert flash == {"total": 4 * B * H * s * (4 * D + 1), "beyond_inputs": 4 * B * H * s * (D + 1)}
        # Naive: the probabilities (float32) and the causal mask (bool), s x s, beyond q, k, v.
        assert naive["beyond_inputs"] == 4 * B * H * s * s + s * s


def test_tiles_of_a_causal_square_and_refusals():
    assert tile_kind(0, 4, 4, 8, causal=True) == "skip"
    assert tile_kind(4, 8, 0, 4, causal=True) == "full"
    assert tile_kind(4, 8, 4, 8, causal=True) == "causal"
    assert tile_kind(0, 4, 4, 8, causal=False) == "full"
    # 10 positions in tiles of 4: 3 x 3, the last row and column of 2 positions.
    assert tile_grid(10, 4, causal=True) == [
        ["causal", "skip", "skip"],
        ["full", "causal", "skip"],
        ["full"] * 2 + ["causal"],
    ]
    q, k, v = qkv(T=4)
    with pytest.raises(ValueError, match="block_size"):
        flash_attention(q, k, v, causal=True, block_size=0)
    with pytest.raises(ValueError, match="backward_with"):
        flash_attention(q, k, v, causal=True, block_size=2, backward_with="mean")
    with pytest.raises(ValueError, match="as many queries as keys"):
        flash_attention(q, k[..., :3, :], v[..., :3, :], causal=True, block_size=2)


def test_plot_tiles_draws_each_computed_tile_where_it_is():
    ax = Figure().subplots()
    memory_figures.plot_tiles(ax, tile_grid(10, 4, causal=True), 10, 4)
    # 6 computed tiles: each a filled shape and an outline; the skipped 3 draw nothing.
    fills = [p for p in ax.patches if p.get_fill()]
    outlines = [p for p in ax.patches if not p.get_fill()]
    assert len(fills) == len(outlines) == 6
    # The last diagonal tile: a triangle of the keys 8..9 at or before the queries 8..9.
    assert sorted(map(tuple, fills[-1].get_xy()[:3].tolist())) == [(8.0, 8.0), (8.0, 10.0), (10.0, 10.0)]
    # A full tile: queries 4..7 against keys 0..3.
    assert any(
        isinstance(p, Rectangle) and p.get_xy() == (0, 4) and p.get_width() == p.get_height() == 4 for p in fills
    )
    assert ax.get_ylim() == (10.0, 0.0) and "6 of 9 computed" in ax.get_title()


def test_plot_saved_bytes_draws_both_curves_on_log_axes():
    ax = Figure().subplots()
    memory_figures.plot_saved_bytes(ax, [64, 128], [100, 400], [10, 20])
    naive, flash = ax.get_lines()
    assert list(naive.get_ydata()) == [100, 400] and list(flash.get_ydata()) == [10, 20]
    assert list(flash.get_xdata()) == [64, 128]
    assert ax.get_xscale() == ax.get_yscale() == "log"
