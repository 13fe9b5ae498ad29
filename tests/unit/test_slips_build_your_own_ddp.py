"""Lab 05's slips where no injected slip reaches them: a rank's weights after wrapping and each step's
gradients once synchronized, silent on a right result and on a difference no slip explains, and the
weights when both parameters and buffers are the rank's own. The slips the checker names for the
solution with each slip injected: tests/launches/test_slips_lab05.py."""

import torch
from torch import nn

from parallel_course.slips.build_your_own_ddp import broadcast_slip, gradient_slip


class WithBuffer(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(3, 2)
        self.register_buffer("position", torch.randn(3))


def test_weights_after_wrapping_rank_0s_or_all_its_own():
    rank0 = WithBuffer(0)
    assert broadcast_slip(WithBuffer(0), rank0) is None
    # (parameters only, or buffers only, its own: the injected slips)
    assert "parameters and buffers are its own, not rank 0's" in broadcast_slip(WithBuffer(1), rank0)


def grads(scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": scale * torch.randn(4, 3, generator=g), "b": scale * torch.randn(3, generator=g)}


def test_no_slip_named_where_the_gradients_agree_or_none_fits():
    whole, own = [grads(), grads(seed=1)], [grads(seed=2), grads(seed=3)]
    assert gradient_slip(whole, whole, own, 2) is None
    # another difference, or a parameter without its gradient
    assert gradient_slip([grads(seed=5), grads(seed=1)], whole, own, 2) is None
    assert gradient_slip([{"a": grads()["a"]}, grads(seed=1)], whole, own, 2) is None
