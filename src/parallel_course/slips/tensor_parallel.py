"""Lab 07b (column- and row-parallel linear layers): the likely slips, recognised from what the
student's layers produced on every rank.

- ``parameter_slip``: a weight split along the wrong dimension, kept whole, a bias split where it
  should be whole or whole where it should be split;
- ``output_slip``: only this rank's slice returned, the bias added on every rank, the partial
  results never summed, the output features in another order;
- ``gradient_slip``: an input gradient that is only this rank's part (the backward communication
  left out); ``scale_slip``: a constant times the expected one;
- ``memory_slip``: a layer that holds more than its slices (measured: the bytes of the tensors it
  keeps alive): a slice that is a view of the whole weight, or the whole layer kept;
- ``collectives_slip``: the collectives of a column -> row MLP, counted in forward and backward,
  against Megatron's one all_reduce each way (a column layer that gathers, a row layer that
  slices again: the flags ignored).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Two results agree when they differ by at most this, relative to the larger one's largest element.
RTOL = 1e-4


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> bool:
    if a.shape != b.shape:
        return False
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12) if a.numel() else 1.0
    return (a.double() - b.double()).abs().max().item() <= rtol * scale


def _shape(t) -> tuple | None:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None


def expected_shapes(kind: str, weight: tuple, world_size: int) -> dict[str, tuple]:
    """The shapes of a rank's weight and bias in a ``kind`` ("column" or "row") parallel layer made
    from an nn.Linear whose weight has shape ``weight`` (out, in)."""
    out, in_ = weight
    if kind == "column":
        return {"weight": (out // world_size, in_), "bias": (out // world_size,)}
    return {"weight": (out, in_ // world_size), "bias": (out,)}


def parameter_slip(kind: str, got: dict[str, tuple | None], weight: tuple, world_size: int) -> str | None:
    """The slip that the shapes ``got`` ({"weight": shape, "bias": shape}, None where no tensor) of
    a ``kind`` ("column" or "row") parallel layer point to, for an nn.Linear of weight shape (out, in)."""
    out, in_ = weight
    if got.get("weight") is None or got.get("bias") is None:
        missing = [name for name in ("weight", "bias") if got.get(name) is None]
        return f"self.{missing[0]} is not a tensor: is it set, as an nn.Parameter?"
    if got["weight"] == (out, in_):
        return "the whole W on every rank: a rank keeps only its slice of it"
    if kind == "column" and got["weight"] == (out, in_ // world_size):
        return (
            "W is split along its input features (dim 1): a column-parallel layer keeps a slice of the output features"
        )
    if kind == "row" and got["weight"] == (out // world_size, in_):
        return "W is split along its output features (dim 0): a row-parallel layer keeps a slice of the input features"
    if kind == "column" and got["bias"] == (out,):
        return (
            "the whole bias: in a column-parallel layer each rank computes a slice of the output features "
            "and keeps the bias's slice for them"
        )
    if kind == "row" and got["bias"] == (out // world_size,):
        return (
            "a slice of the bias: a row-parallel layer's partial results are summed into the whole "
            "output, to which the whole bias is added once"
        )
    return None


def _feature_order(got: torch.Tensor, expected: torch.Tensor) -> list[int] | None:
    """For each output feature (last dimension) of ``got``, the feature of ``expected`` it equals;
    None unless every one matches exactly one."""
    order = []
    for j in range(got.shape[-1]):
        matches = [i for i in range(expected.shape[-1]) if _close(got[..., j], expected[..., i])]
        if len(matches) != 1:
            return None
        order.append(matches[0])
    return order if sorted(order) == list(range(expected.shape[-1])) else None


def output_slip(
    outputs: Sequence[torch.Tensor], expected: torch.Tensor, bias: torch.Tensor | None, rank: int
) -> str | None:
    """The slip that every rank's output (``outputs``, rank order) points to, seen from ``rank``,
    where every rank should return the whole ``expected``; ``bias``: the layer's whole bias."""
    world_size, mine = len(outputs), outputs[rank]
    if not isinstance(mine, torch.Tensor):
        return None
    my_slice = expected.chunk(world_size, dim=-1)[rank]
    if mine.shape != expected.shape:
        if _close(mine, my_slice):
            return (
                "only this rank's slice of the output features: with gather_output=True the ranks' slices "
                "are gathered into the whole output"
            )
        return None
    if bias is not None and _close(mine - expected, (world_size - 1) * bias.expand_as(mine)):
        return (
            f"the bias is added on every rank before the partial results are summed: {world_size} times "
            "in all; it belongs once, after the sum"
        )
    if all(isinstance(o, torch.Tensor) and o.shape == expected.shape for o in outputs):
        total = torch.stack([o.double() for o in outputs]).sum(0)
        offsets = [0.0] if bias is None else [0.0, world_size - 1.0, -1.0]
        for k in offsets:
            shifted = expected.double() if k == 0 else expected.double() + k * bias.double().expand_as(expected)
            if _close(total, shifted):
                return (
                    "each rank's output is only its partial result (the ranks' outputs add up to the "
                    "expected one): the partial results are not summed over the ranks"
                )
    order = _feature_order(mine, expected)
    if order is not None and order != list(range(len(order))):
        return (
            "the right output features in another order: rank r's slice must be chunk r of the features "
            f"(torch.chunk order); here feature 1 is the expected feature {order[1]}"
        )
    return None


def gradient_slip(grads: Sequence[torch.Tensor], expected: torch.Tensor, rank: int) -> str | None:
    """The slip that every rank's gradient of the whole input (``grads``, rank order) points to,
    seen from ``rank``, where every rank should hold the whole ``expected``."""
    world_size, mine = len(grads), grads[rank]
    if not isinstance(mine, torch.Tensor) or mine.shape != expected.shape:
        return None
    if all(isinstance(g, torch.Tensor) and g.shape == expected.shape for g in grads):
        total = torch.stack([g.double() for g in grads]).sum(0)
        if _close(total, expected) and not _close(mine, expected):
            slices = [g.chunk(world_size, dim=-1) for g in grads]
            disjoint = all(
                not s.abs().max() > 0 for r, parts in enumerate(slices) for i, s in enumerate(parts) if i != r
            )
            if disjoint:
                return (
                    "the input gradient holds only this rank's slice of the features, zeros elsewhere: was "
                    "the input sliced without ScatterToShards, whose backward gathers the slices?"
                )
            return (
                "each rank's input gradient is only its own contribution (the ranks' add up to the expected "
                "one): does the input go through CopyToShards, whose backward sums them over the ranks?"
            )
    return scale_slip(mine, expected)


def scale_slip(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """When ``got`` is one constant (not 1) times ``expected``: say so. None otherwise."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    reference = expected.double().reshape(-1)
    if not reference.abs().max() > 0:
        return None
    scale = (got.double().reshape(-1) @ reference / (reference @ reference)).item()
    if abs(scale - 1) > RTOL and _close(got.double(), scale * expected.double()):
        return f"every element is {scale:.2f}x the expected one"
    return None


def memory_slip(weight, held: int, expected: int) -> str | None:
    """Why a layer holds ``held`` bytes where its slices take ``expected``; ``weight``: its weight."""
    if held <= expected:
        return None
    if isinstance(weight, torch.Tensor) and weight.untyped_storage().nbytes() > weight.numel() * weight.element_size():
        return (
            "its weight is a view into the whole weight: the slice keeps all of W alive on every rank; "
            ".clone() it (a rank holds 1/N of the weight)"
        )
    return "it keeps more than its slices (the nn.Linear itself, or a copy of W): a rank holds 1/N of the weight"


def describe_calls(calls: Sequence[tuple[str, int]]) -> str:
    """Collectives as "all_reduce of 32 elements, ..." (or "none")."""
    return ", ".join(f"{name} of {numel:,} elements" for name, numel in calls) or "none"


def collectives_slip(forward: Sequence[tuple[str, int]], backward: Sequence[tuple[str, int]]) -> str | None:
    """What the collectives of a column -> ReLU -> row MLP point to, beyond one all_reduce each way."""
    names = [name for name, _ in [*forward, *backward]]
    if "all_gather" in names or "all_gather_into_tensor" in names:
        return (
            "an all_gather: does the column layer gather its output though gather_output=False, and the row layer "
            "cut it again though input_is_sharded=True? Each rank keeps its slice of the hidden features; only "
            "the row layer's sum travels"
        )
    return None
