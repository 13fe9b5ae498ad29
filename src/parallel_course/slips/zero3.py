"""Lab 11 (ZeRO-3 by hand): the likely slips, recognised from what the student's code produced.

- ``shard_slip``: ``shard_of``'s pieces cut too short, the last one not padded, strided, every
  rank given the same piece, or a view that keeps the whole tensor alive;
- ``gradient_scale_slip``: every gradient a constant times the reference's (N: the sum over the
  ranks where the average is wanted);
- ``collective_slip``: the collectives counted in one step: no gather in backward (the layer not
  recomputed), an all-reduce where a reduce-scatter is wanted, no reduce-scatter at all;
- ``kept_whole_slip``: layers that still hold their whole parameters after forward, or after
  backward (set back to None without ``finally:``: the recompute stops early);
- ``recursion_slip``: a forward that calls the wrapped layer again instead of its own forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from parallel_course.checks import CheckFailed

# Two results agree when they differ by at most this, relative to the larger one's largest element.
RTOL = 1e-4


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> bool:
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12)
    return a.shape == b.shape and (a - b).abs().max().item() <= rtol * scale


def _strided(flat: torch.Tensor, rank: int, world_size: int, size: int) -> torch.Tensor:
    """Every world_size-th element from ``rank`` on, zeros after the end: a piece cut the wrong way."""
    picked = flat[rank::world_size]
    return torch.cat([picked, picked.new_zeros(max(size - picked.numel(), 0))])


def shard_slip(pieces: Sequence[torch.Tensor], flat: torch.Tensor, world_size: int) -> str | None:
    """The slip that ``pieces`` (what shard_of returned for ranks 0, 1, ...) point to, or None.

    Called when the pieces are wrong, or to see whether right values are a view."""
    numel, size = flat.numel(), math.ceil(flat.numel() / world_size)
    lengths = [p.numel() for p in pieces]
    if lengths == [numel // world_size] * world_size and numel % world_size:
        lost = numel - world_size * (numel // world_size)
        return (
            f"every piece has numel // world_size = {numel // world_size} elements, so the last {lost} "
            f"element(s) are in no piece: pieces must be ceil(numel / world_size) = {size} long"
        )
    if lengths[:-1] == [size] * (world_size - 1) and lengths[-1] < size:
        return (
            f"the last piece has {lengths[-1]} elements and the others {size}: it must be padded with "
            f"zeros to {size} (collectives want pieces of equal size)"
        )
    if len(pieces) > 1 and all(torch.equal(p, pieces[0]) for p in pieces[1:]):
        return "every rank gets the same piece: is the piece chosen by `rank`?"
    if all(p.numel() == size and torch.equal(p, _strided(flat, r, world_size, size)) for r, p in enumerate(pieces)):
        return (
            f"piece r holds elements r, r + {world_size}, r + {2 * world_size}, ... (a stride): a piece is a "
            "run of consecutive elements, so that the pieces gathered in rank order are the tensor in order"
        )
    views = [r for r, p in enumerate(pieces) if p.untyped_storage().nbytes() > p.numel() * p.element_size()]
    if views:
        whole = pieces[views[0]].untyped_storage().nbytes() // pieces[views[0]].element_size()
        return (
            f"the piece of rank {views[0]} is a view into a tensor of {whole} elements: a shard that is a "
            "view keeps the whole tensor alive; return a copy"
        )
    return None


def check_pieces(what: str, pieces: Sequence[torch.Tensor], flat: torch.Tensor, expected: list[list[float]]) -> None:
    """Lab 11's in-kernel check of shard_of: PASS, or a FAIL line that names the likely slip."""
    got = [p.tolist() for p in pieces]
    slip = shard_slip(pieces, flat, len(pieces))
    if got != expected:
        raise CheckFailed(f"FAIL {what}: expected {expected}, got {got}" + (f": {slip}" if slip else ""))
    if slip:
        raise CheckFailed(f"FAIL {what}: right values, but {slip}")
    print(f"PASS {what}: {got}, each a tensor of its own")


def gradient_scale_slip(
    got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], world_size: int, rtol: float = 1e-3
) -> str | None:
    """When every gradient is one constant times the reference's: say so, and what that constant
    suggests (N: the sum over the ranks returned where the average is wanted). None otherwise."""
    g = torch.cat([t.detach().reshape(-1).double().cpu() for t in got])
    r = torch.cat([t.detach().reshape(-1).double().cpu() for t in expected])
    if g.shape != r.shape or not r.abs().max() > 0:
        return None
    scale = (g @ r / (r @ r)).item()
    if abs(scale - 1) <= rtol or not _close(g, scale * r, rtol):
        return None
    line = f"every gradient is {scale:.2f}x the reference's"
    if abs(scale - world_size) <= rtol * world_size:
        return line + ": does backward return the sum instead of the average?"
    if abs(scale * world_size - 1) <= rtol:
        return line + ": is the average divided by the number of ranks once more?"
    return line


def collective_slip(
    forward_gathers: int, backward_gathers: int, reduce_scatters: int, backward_all_reduces: int, layers: int
) -> str | None:
    """The slip that one step's count of collectives points to, for ``layers`` layers, or None."""
    if forward_gathers == layers and backward_gathers == 0:
        return (
            "no all-gather in backward: does the layer's forward go through checkpoint(...)? Called "
            "directly, autograd keeps every gathered parameter alive until backward"
        )
    if reduce_scatters == 0 and backward_all_reduces >= layers:
        return (
            "backward all-reduces the gradients instead of reduce-scattering them: every rank receives "
            "the whole gradient where it needs its shard's only"
        )
    if reduce_scatters == 0:
        return "no reduce-scatter in backward: how does a rank receive its shard's gradient, summed over the ranks?"
    if forward_gathers == 0 and backward_gathers == 0:
        return "no all-gather at all: how does a layer get its whole parameters?"
    return None


def kept_whole_slip(kept: Sequence[str], after: str = "forward") -> str | None:
    """``kept``: the names of the whole parameters that layers still hold ``after`` forward or backward."""
    if not kept:
        return None
    if after == "backward":
        return (
            f"{kept[0]} is still set on its layer after backward: are the whole parameters set back to None in a "
            "finally:? In backward, non-reentrant checkpointing stops the recompute as soon as it has what it "
            "needs: the lines after forward(*inputs) may never run"
        )
    return (
        f"{kept[0]} is still set on its layer after forward: are the whole parameters set back to None "
        "once the layer has computed?"
    )


def recursion_slip() -> str:
    """What a forward that recursed without end points to."""
    return (
        "the forward recursed without end (RecursionError): does run() call layer(*inputs)? The layer's forward "
        "is now gathered, which calls run again; call forward(*inputs), the layer's own forward that _gathered "
        "was given"
    )
