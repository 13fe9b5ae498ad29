"""A large cluster in one process (chapter 14a): torch's ``fake`` process group, a (dp, tp) device
mesh of hundreds of ranks, and a GPT of a real size on the meta device (shapes, no storage),
sharded as ``train_gpt.py --parallel 2d`` shards the course's small one, by the very functions it
applies (``parallel_course.training.parallelize``): ``apply_tp``, tensor parallelism with
``parallelize_module`` inside each tp group, then ``apply_fsdp``, ``fully_shard`` (FSDP2, ZeRO-3)
over dp.

The fake group answers every collective at once without moving data, so nothing is trained; what
it shows is what each rank would store: local shapes, placements and bytes of every parameter.
``FakeStore`` and the ``fake`` backend come from ``torch.testing._internal.distributed.fake_pg``
(an internal module of torch's tests, present in torch 2.x; it may move in a later release).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from .gpt import GPT, GPTConfig
from .training.parallelize import apply_fsdp, apply_tp

# A 7-billion-parameter-class configuration of the course's GPT: LLaMA 2 7B's depth, width, heads,
# vocabulary and context (Touvron et al. 2023, "Llama 2", Table 1 and section 2.2: 32 layers, 4096
# wide, 32 heads, 32,000 tokens, 4,096 positions), with the course's 4h GELU MLP, biases and
# learned positions: 6.72 billion parameters.
SEVEN_B = GPTConfig(vocab_size=32000, block_size=4096, d_model=4096, n_layers=32, n_heads=32)


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0):
    """This process as rank ``rank`` of a ``fake`` process group of ``world_size`` ranks, destroyed
    on the way out (also after an error): a notebook kernel can enter it again."""
    # Imported here: an internal module of torch's tests, needed only by this function.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    if dist.is_initialized():
        raise RuntimeError("a process group exists in this process already: destroy it first")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class Parameter:
    """One parameter as one rank stores it."""

    name: str
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    placements: str
    local_bytes: int


@dataclass(frozen=True)
class ShardedModel:
    """What one rank of a (dp, tp) mesh stores of a model: every parameter, and the totals."""

    world_size: int
    dp: int
    tp: int
    rank: int
    parameters: tuple[Parameter, ...]

    @property
    def total_parameters(self) -> int:
        """Elements of the whole model."""
        return sum(_numel(p.shape) for p in self.parameters)

    @property
    def local_parameters(self) -> int:
        """Elements this rank stores."""
        return sum(_numel(p.local_shape) for p in self.parameters)

    @property
    def local_bytes(self) -> int:
        return sum(p.local_bytes for p in self.parameters)

    def parameter(self, name: str) -> Parameter:
        return next(p for p in self.parameters if p.name == name)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def shard_on_fake_mesh(
    cfg: GPTConfig = SEVEN_B,
    dp: int = 8,
    tp: int = 8,
    rank: int = 0,
    sequence_parallel: bool = True,
    dtype: torch.dtype = torch.float32,
) -> ShardedModel:
    """The course's GPT of configuration cfg built on the meta device, sharded over a fake (dp, tp)
    mesh of dp x tp ranks as ``train_gpt.py --parallel 2d --sequence-parallel`` shards it (apply_tp,
    then apply_fsdp), as rank ``rank`` sees it. The group is destroyed before this returns; a second
    call builds a fresh one. About a second for SEVEN_B."""
    if cfg.n_heads % tp or cfg.vocab_size % tp:
        raise ValueError(f"tp {tp} must divide the {cfg.n_heads} heads and the {cfg.vocab_size} tokens")
    with fake_world(dp * tp, rank):
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        # Shapes only: no rank could hold 27 GB of float32 weights, and none needs to here.
        with torch.device("meta"):
            model = GPT(cfg).to(dtype)
        if tp > 1:
            apply_tp(model, mesh["tp"], sequence_parallel)
        apply_fsdp(model, mesh["dp"])
        rows = []
        for name, p in model.named_parameters():
            mine = p.to_local() if isinstance(p, DTensor) else p
            placements = str(p.placements) if isinstance(p, DTensor) else "whole"
            rows.append(
                Parameter(name, tuple(p.shape), tuple(mine.shape), placements, mine.numel() * mine.element_size())
            )
    return ShardedModel(world_size=dp * tp, dp=dp, tp=tp, rank=rank, parameters=tuple(rows))
