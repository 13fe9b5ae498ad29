"""Lab 05's slips: a rank's weights after wrapping, and each step's gradients once synchronized."""

import torch
from torch import nn

from parallel_course.slips.build_your_own_ddp import broadcast_slip, gradient_slip


class WithBuffer(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(3, 2)
        self.register_buffer("position", torch.randn(3))


def test_weights_after_wrapping():
    rank0 = WithBuffer(0)
    assert broadcast_slip(WithBuffer(0), rank0) is None
    own = WithBuffer(1)
    assert "parameters and buffers are its own, not rank 0's" in broadcast_slip(own, rank0)
    own.position.copy_(rank0.position)
    assert "parameters (e.g. linear.weight) are its own, not rank 0's, its buffers rank 0's" in broadcast_slip(
        own, rank0
    )
    own.load_state_dict(rank0.state_dict())
    own.position.add_(1)
    assert "buffer position is its own, not rank 0's: are the buffers broadcast too?" in broadcast_slip(own, rank0)


def grads(scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": scale * torch.randn(4, 3, generator=g), "b": scale * torch.randn(3, generator=g)}


def test_the_first_step_whose_gradients_differ_names_the_slip():
    whole, own = [grads(), grads(seed=1)], [grads(seed=2), grads(seed=3)]
    assert gradient_slip(whole, whole, own, 2) is None
    assert "every gradient of step 1 is 2.00x the reference's: is the sum over the ranks divided" in gradient_slip(
        [grads(2.0), grads(2.0, seed=1)], whole, own, 2
    )
    assert "every gradient of step 2 is 0.25x the reference's: is the average divided by the world size once more?" in (
        gradient_slip([grads(), grads(0.25, seed=1)], whole, own, 4)
    )
    assert "every gradient of step 1 is this rank's own, of its shard alone" in gradient_slip(own, whole, own, 2)
    # another difference, or a parameter without its gradient: no slip named
    assert gradient_slip([grads(seed=5), grads(seed=1)], whole, own, 2) is None
    assert gradient_slip([{"a": grads()["a"]}, grads(seed=1)], whole, own, 2) is None
