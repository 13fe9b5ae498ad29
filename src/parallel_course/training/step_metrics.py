"""What the capstone's trainer measures as it trains, for metrics.json: the bytes a rank holds
(parameters, gradients, what FSDP2 keeps between micro-batches, the activations autograd saves for
backward), the collectives of one tensor-parallel block, and when each optimizer step ends, from
which the run's throughput follows (``parallel_course.throughput``).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from ..float8 import plain_storage
from ..gpt import AdditionTask, GPTConfig
from ..planner import flops_per_token
from ..throughput import measure_matmul_peak, summary


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank stores: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of the optimizer's state this rank holds (AdamW: two moments per parameter it updates)."""
    return nbytes(t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor))


class SavedActivations:
    """Bytes of the tensors autograd keeps for backward (parameters excluded, views of one storage
    once): a CPU has no allocator statistics; on a GPU, torch.cuda.max_memory_allocated has it all."""

    def __init__(self, model):
        self.model, self.storages, self.bytes = model, set(), 0

    def pack(self, t):
        storage = plain_storage(t)
        # The parameters as they are now: FSDP swaps in the whole ones only around a block's forward.
        # (plain_storage: torchao's FP8 weight wraps a tensor whose own untyped_storage() raises.)
        weights = {plain_storage(p).data_ptr() for p in self.model.parameters()}
        # Weights, or views of them, are no activations.
        if storage.data_ptr() not in weights | self.storages:
            self.storages.add(storage.data_ptr())
            self.bytes += storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def held_gradient_bytes(model) -> int:
    """Bytes of gradient this rank holds now: .grad (a shard under FSDP), plus the whole gradients
    FSDP2 keeps between micro-batches while it does not reduce them (torch's internal bookkeeping,
    read here only to measure; on a torch whose internals differ, .grad alone, with a note)."""
    held = nbytes(p.grad for p in model.parameters() if p.grad is not None)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            whole = fsdp_whole_gradients(module)
            if whole is None:
                return held
            held += nbytes(whole)
    return held


# Whether the note on FSDP2's internals has been printed (once per process).
FSDP_NOTED = []


def fsdp_whole_gradients(module) -> list | None:
    """The whole (unsharded) gradients FSDP2 keeps for a module between micro-batches, as torch 2.13
    keeps them (a list of parameter groups; one group, or None, before); None, with a one-line
    note from rank 0, on a torch whose internals differ."""
    try:
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            groups = [g for g in [state._fsdp_param_group] if g is not None]
        whole = []
        for param in (param for group in groups for param in group.fsdp_params):
            whole.append(param.unsharded_accumulated_grad)
            if hasattr(param, "_unsharded_param"):
                whole.append(param._unsharded_param.grad)
    except AttributeError as error:
        if not FSDP_NOTED and dist.get_rank() == 0:
            sys.stderr.write(
                f"note: torch {torch.__version__} has no FSDP2 internals as in torch 2.13 ({error}): "
                "the gradient bytes held between micro-batches count .grad only\n"
            )
        FSDP_NOTED.append(True)
        return None
    return [g for g in whole if g is not None]


def block_collectives(comms) -> dict:
    """The collectives of the first block in a step CommDebugMode watched, by phase; {} if none did."""
    if not isinstance(comms, CommDebugMode):
        return {}
    block = next(counts for name, counts in comms.comm_module_counts.items() if name.endswith("blocks.0"))
    return {phase: {str(op): n for op, n in block[phase].items()} for phase in block}


class StepClock:
    """When each optimizer step ends (a hook on the optimizer): the time between two ends is one whole
    step, data, forward, backward, communication, update and any checkpoint saved after it. The first
    interval starts when the clock is made, and pays for the warm-ups."""

    def __init__(self, optimizer, device: torch.device):
        self.device, self.ends = device, [time.perf_counter()]
        optimizer.register_step_post_hook(self.tick)

    def tick(self, optimizer, args, kwargs) -> None:
        # A GPU runs behind the Python that queued its work: the step ends when the device is done.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.ends.append(time.perf_counter())

    @property
    def step_times_s(self) -> list[float]:
        return [end - start for start, end in zip(self.ends, self.ends[1:])]


def throughput(cfg: GPTConfig, task: AdditionTask, global_batch: int, step_times_s, device, mfu: bool) -> dict:
    """The run's throughput (parallel_course.throughput.summary): tokens per step and model FLOPs per
    token of the whole global batch (planner.flops_per_token: 6 x the matmul weights a token uses,
    plus attention), the median step after the first. With mfu, each process's matmul peak, measured
    now while the others measure theirs (the cores are shared as in training): a collective."""
    per_token = flops_per_token(
        layers=cfg.n_layers,
        hidden=cfg.d_model,
        seq_len=task.seq_len,
        vocab=cfg.vocab_size,
        ffn=cfg.mlp_ratio * cfg.d_model,
        moe_experts=cfg.moe_experts,
        top_k=cfg.top_k,
    )
    peaks = None
    if mfu:
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, measure_matmul_peak(device=device).flops_per_s)
    return summary(global_batch * task.seq_len, step_times_s, per_token, peaks)
