"""The norm of the whole model's gradient in any of the capstone's layouts, and clipping by it
(chapter 15): torch's ``clip_grad_norm_`` for a model spread over ranks.

The L2 norm counts every parameter exactly once, however the layout spreads it:

- a DTensor's gradient (FSDP's shards, tensor parallelism's pieces, both in 2d) is squared and
  summed by DTensor: its placements say which mesh dimensions hold other pieces of it (summed
  over them) and which hold copies (counted once);
- a pipeline stage holds other parameters than the next one: the stages' squares are summed over pp;
- an ep rank holds other experts than its ep peers: the experts' squares are summed over ep, and
  over ep only (the ranks of expert_dp hold copies);
- whole copies (ddp's and cp's replicas, the dense part under ep, tensor parallelism's plain
  embeddings and norms) count once: nothing to reduce.

Every rank then takes the same number (the largest over the world, a non-finite one winning), so
that every rank clips by the same factor and skips the same steps, even where one rank's copy of a
replicated gradient went bad alone.

``SLIPS``: the classic mistakes, each a norm computed wrong, for the chapter's negative controls
(``train_gpt.py --slip``).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# What the name of an expert's parameter holds (blocks.0.mlp.experts.3.fc.weight).
EXPERT = ".experts."


def square_sums(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums of squares of this rank's gradients, (dense part, experts), each DTensor's whole.
    DTensor squares and sums a gradient into a scalar that is Partial over the mesh dimensions whose
    ranks hold other pieces of it (Shard: FSDP's and tensor parallelism's pieces) and Replicate over
    those that hold copies; the partial sums are added up by mesh and placements, then all-reduced
    over each Partial dimension, once per group."""
    device = next(model.parameters()).device
    plain = {False: torch.zeros((), device=device), True: torch.zeros((), device=device)}
    # DTensor's squares by (expert?, mesh, placements): added up first, then reduced once a group.
    spread = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        # A Partial gradient (a norm's weight under sequence parallelism) is summed before it is
        # squared: DTensor's pow does that redistribution itself.
        square = p.grad.float().pow(2).sum()
        if isinstance(square, DTensor):
            key = (EXPERT in name, square.device_mesh, square.placements)
            spread[key] = spread[key] + square if key in spread else square
        else:
            plain[EXPERT in name] += square
    for (expert, mesh, placements), square in spread.items():
        total = square.to_local()
        for dim, placement in enumerate(placements):
            if placement.is_partial():
                dist.all_reduce(total, group=mesh.get_group(dim))
        plain[expert] += total
    return plain[False], plain[True]


def gradient_norm(model: torch.nn.Module, meshes=None) -> torch.Tensor:
    """The L2 norm of the whole model's gradient, every parameter counted once, the same on every
    rank (a collective: every rank of the world calls it). meshes: the layout's (layouts.Meshes),
    which says where stages and experts lie; None for a model whose only spread is its DTensors."""
    dense, experts = square_sums(model)
    if meshes is not None and meshes.experts is not None:
        dist.all_reduce(experts, group=meshes.experts.get_group("ep"))
    total = dense + experts
    if meshes is not None and meshes.size("pp") > 1:
        dist.all_reduce(total, group=meshes["pp"].get_group())
    # The same number on every rank, even where one rank's copy of a gradient went bad alone: the
    # largest of the world's, a non-finite one (NaN made inf) winning.
    norm = total.sqrt()
    norm = torch.where(norm.isfinite(), norm, torch.full_like(norm, math.inf))
    dist.all_reduce(norm, op=dist.ReduceOp.MAX)
    return norm


def clip_gradients(model: torch.nn.Module, max_norm: float, norm: torch.Tensor) -> float:
    """Scale this rank's gradients so that the whole gradient's norm is at most max_norm, as
    torch.nn.utils.clip_grad_norm_ does (the factor max_norm / (norm + 1e-6), if below 1); norm is
    gradient_norm's, the same on every rank, so every rank scales by the same factor. Returns it."""
    factor = min(1.0, max_norm / (norm.item() + 1e-6))
    if factor < 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    return factor


def inject_nonfinite(model: torch.nn.Module) -> None:
    """A fault, for the test that every rank skips the step: the first element of this rank's first
    gradient becomes NaN (on this rank only, even where other ranks hold a copy of it)."""
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    (grad.to_local() if isinstance(grad, DTensor) else grad).view(-1)[0] = math.nan


# --- the classic slips, for negative controls ------------------------------------------------


def _local_square_sums(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums of squares of the gradient pieces this rank stores, nothing reduced."""
    device = next(model.parameters()).device
    sums = [torch.zeros((), device=device), torch.zeros((), device=device)]
    for name, p in model.named_parameters():
        if p.grad is not None:
            piece = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            sums[EXPERT in name] += piece.float().pow(2).sum()
    return sums[0], sums[1]


def local_norm(model, meshes) -> torch.Tensor:
    """Slip: the norm of this rank's own pieces only (each rank clips by its own number)."""
    dense, experts = _local_square_sums(model)
    return (dense + experts).sqrt()


def replicas_counted(model, meshes) -> torch.Tensor:
    """Slip: every rank's squares added over the world, copies included (a ddp replica counted N times)."""
    dense, experts = _local_square_sums(model)
    total = dense + experts
    dist.all_reduce(total)
    return total.sqrt()


def stages_unreduced(model, meshes) -> torch.Tensor:
    """Slip: the pipeline stages never reduced (each stage's own parameters only)."""
    dense, experts = square_sums(model)
    if meshes.experts is not None:
        dist.all_reduce(experts, group=meshes.experts.get_group("ep"))
    return (dense + experts).sqrt()


def experts_every_rank(model, meshes) -> torch.Tensor:
    """Slip: the experts' squares summed over every rank, not their ep group: each expert counted
    once per replica (right only where each expert has one, ep)."""
    dense, experts = square_sums(model)
    dist.all_reduce(experts)
    total = dense + experts
    if meshes.size("pp") > 1:
        dist.all_reduce(total, group=meshes["pp"].get_group())
    return total.sqrt()


def norms_added(model, meshes) -> torch.Tensor:
    """Slip: the stages' norms added instead of their squares."""
    dense, experts = square_sums(model)
    if meshes.experts is not None:
        dist.all_reduce(experts, group=meshes.experts.get_group("ep"))
    norm = (dense + experts).sqrt()
    if meshes.size("pp") > 1:
        dist.all_reduce(norm, group=meshes["pp"].get_group())
    return norm


# Each slip's norm, by the name train_gpt.py --slip takes (its check() refuses a layout that cannot show it).
SLIPS = {
    "local-norm": local_norm,
    "replicas-counted": replicas_counted,
    "stages-unreduced": stages_unreduced,
    "experts-every-rank": experts_every_rank,
    "norms-added": norms_added,
}
