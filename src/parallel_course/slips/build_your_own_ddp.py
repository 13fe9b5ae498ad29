"""Lab 05 (build your own DDP): the likely slips, recognised from what the wrapper made of the weights
and of each step's gradients.

- ``broadcast_slip``: after wrapping, a rank's parameters or buffers are still its own, not rank 0's
  (nothing broadcast, or the parameters only, or into copies);
- ``gradient_slip``: the first step whose gradients (once synchronized) are not the whole batch's:
  N times them (summed over the ranks, never divided), 1/N of them (divided twice), or this rank's
  own gradients (the averages never reach ``.grad``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from parallel_course.checks import scale_of

# Two gradients agree when they differ by at most this, relative to the larger one's largest element.
RTOL = 1e-4


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape != b.shape or not torch.equal(a.detach().cpu(), b.detach().cpu())


def broadcast_slip(model: nn.Module, rank0: nn.Module) -> str | None:
    """Whether ``model``, just wrapped, holds the parameters and buffers of ``rank0`` (a model built
    with rank 0's initialisation): the slip when it does not, else None."""
    theirs = dict(rank0.named_parameters()) | dict(rank0.named_buffers())
    params = [n for n, p in model.named_parameters() if n in theirs and _differ(p, theirs[n])]
    buffers = [n for n, b in model.named_buffers() if n in theirs and _differ(b, theirs[n])]
    if params and buffers:
        return (
            "after wrapping, this rank's parameters and buffers are its own, not rank 0's: does the constructor "
            "broadcast them, in place?"
        )
    if params:
        return (
            f"after wrapping, this rank's parameters (e.g. {params[0]}) are its own, not rank 0's, its buffers "
            "rank 0's: are the parameters broadcast, in place?"
        )
    if buffers:
        return (
            f"after wrapping, this rank's buffer {buffers[0]} is its own, not rank 0's: are the buffers broadcast too?"
        )
    return None


def _same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    if got.keys() != expected.keys():
        return False
    for name, e in expected.items():
        g = got[name].detach().double().cpu()
        e = e.detach().double().cpu()
        largest = max(g.abs().max().item(), e.abs().max().item(), 1e-12)
        if g.shape != e.shape or not (g - e).abs().max().item() <= RTOL * largest:
            return False
    return True


def gradient_slip(
    synced: Sequence[dict[str, torch.Tensor]],
    expected: Sequence[dict[str, torch.Tensor]],
    own: Sequence[dict[str, torch.Tensor]],
    world_size: int,
) -> str | None:
    """The slip behind the first step whose synchronized gradients (``synced[k]``, by parameter name)
    are not the whole batch's (``expected[k]``); ``own[k]``: this rank's gradients of its shard alone.
    None when every step agrees, or no slip fits."""
    for k, (got, want, alone) in enumerate(zip(synced, expected, own)):
        if _same(got, want):
            continue
        step = f"step {k + 1}"
        names = sorted(want)
        if got.keys() == want.keys():
            scale = scale_of([got[n] for n in names], [want[n] for n in names], rtol=RTOL)
            if scale is not None and abs(scale - world_size) <= 1e-3 * world_size:
                return (
                    f"every gradient of {step} is {scale:.2f}x the reference's: is the sum over the ranks "
                    "divided by the world size?"
                )
            if scale is not None and abs(scale * world_size - 1) <= 1e-3:
                return (
                    f"every gradient of {step} is {scale:.2f}x the reference's: is the average divided by the "
                    "world size once more?"
                )
        if _same(got, alone):
            return (
                f"every gradient of {step} is this rank's own, of its shard alone: do the all-reduced values "
                "reach .grad?"
            )
        return None
    return None
