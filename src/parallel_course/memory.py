"""Memory accounting for data-parallel training: bytes per parameter, ZeRO stages, measurements.

The model-state accounting follows the ZeRO paper (Rajbhandari, Rasley, Ruwase & He, "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models", SC20, arXiv:1910.02054,
section 3.1 and Figure 1). Per parameter, training with Adam holds

- the weights the model computes with, its gradients, and
- K bytes of optimizer state: for mixed precision an fp32 master copy of the weights plus
  Adam's two fp32 moments (K = 4 + 4 + 4 = 12); for plain fp32 the two moments (K = 8).

So mixed-precision Adam needs 2 + 2 + 12 = 16 bytes per parameter, and fp32 Adam 4 + 4 + 8 = 16
as well. With N data-parallel ranks, ZeRO stage 1 divides the optimizer states by N, stage 2
also the gradients, stage 3 also the weights; plain data parallelism (DDP) divides nothing.

Everything here is a plain function; ``explorers.zero`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

GB = 1e9  # the paper's GB (and ours): 10^9 bytes

STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
"""Stage 0 is plain data parallelism; stage s of ZeRO shards what stages 1..s add."""

SHARDED = {
    "DDP": "nothing (a full replica per rank)",
    "ZeRO-1": "optimizer states",
    "ZeRO-2": "optimizer states + gradients",
    "ZeRO-3": "optimizer states + gradients + weights",
}


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each part of the model states (Adam)."""

    name: str
    weights: int
    gradients: int
    optimizer: int  # K in the paper: master weights (mixed precision only) + Adam's m and v

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


PRECISIONS = {
    "mixed": Precision("mixed precision (fp16/bf16 weights and gradients, fp32 master + Adam)", 2, 2, 12),
    "fp32": Precision("fp32 (weights, gradients and Adam all fp32)", 4, 4, 8),
}


def precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {name!r}") from None


def bytes_per_parameter(precision_name: str = "mixed") -> dict[str, int]:
    """Bytes per parameter of the weights, gradients and optimizer states, and their total."""
    p = precision(precision_name)
    return {"weights": p.weights, "gradients": p.gradients, "optimizer states": p.optimizer, "total": p.total}


def _stage_index(stage: str | int) -> int:
    if isinstance(stage, int):
        if not 0 <= stage < len(STAGES):
            raise ValueError(f"stage must be 0..{len(STAGES) - 1}, got {stage}")
        return stage
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    return STAGES.index(stage)


def per_rank_breakdown(
    n_params: float, world_size: int, stage: str | int, precision_name: str = "mixed"
) -> dict[str, float]:
    """Bytes of model states on each rank, by part, for a ZeRO stage (0/"DDP" .. 3/"ZeRO-3").

    Activations, temporary buffers and fragmentation are not included (the paper's
    "residual states"): this is the memory for the model states alone.
    """
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    s = _stage_index(stage)
    p = precision(precision_name)
    return {
        "weights": p.weights * n_params / (world_size if s >= 3 else 1),
        "gradients": p.gradients * n_params / (world_size if s >= 2 else 1),
        "optimizer states": p.optimizer * n_params / (world_size if s >= 1 else 1),
    }


def per_rank_bytes(n_params: float, world_size: int, stage: str | int, precision_name: str = "mixed") -> float:
    """Bytes of model states on each rank (the sum of ``per_rank_breakdown``)."""
    return sum(per_rank_breakdown(n_params, world_size, stage, precision_name).values())


def per_rank_table(n_params: float, world_size: int, precision_name: str = "mixed") -> dict[str, float]:
    """Stage name -> bytes of model states per rank, for every stage."""
    return {stage: per_rank_bytes(n_params, world_size, stage, precision_name) for stage in STAGES}


def max_params(memory_bytes: float, world_size: int, stage: str | int, precision_name: str = "mixed") -> float:
    """The most parameters whose model states fit in ``memory_bytes`` per rank (nothing else)."""
    return memory_bytes / per_rank_bytes(1, world_size, stage, precision_name)


# --- what torch actually allocates -------------------------------------------------------------


def tensor_bytes(tensors) -> int:
    """Bytes of the given tensors (each storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if t.untyped_storage().nbytes() and key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of an optimizer's state, by state name (``exp_avg``, ``exp_avg_sq``, ``step``, ...)."""
    out: dict[str, int] = {}
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                out[name] = out.get(name, 0) + value.numel() * value.element_size()
    return out


def training_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Measured bytes of the parameters, their gradients and the optimizer state."""
    params = [p for p in model.parameters()]
    out = {"parameters": tensor_bytes(params), "gradients": tensor_bytes(p.grad for p in params if p.grad is not None)}
    if optimizer is not None:
        out["optimizer state"] = sum(optimizer_state_bytes(optimizer).values())
    return out


def activation_bytes(model: nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass, parameters excluded.

    These are the activations a training step keeps alive between forward and backward.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_ptrs:
            saved[(ptr, t.untyped_storage().nbytes())] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return sum(saved.values())
