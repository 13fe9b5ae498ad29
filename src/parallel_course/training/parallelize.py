"""One function per parallelism, each changing the capstone's GPT in place on its mesh dimension
(torchtitan's ``parallelize.py``): ``apply_pp`` keeps a pipeline stage's share of the blocks,
``apply_tp`` splits every block's layers (``apply_sp`` the layers between them too, by position),
``apply_fsdp`` shards what is left over the data-parallel ranks, ``apply_cp`` makes attention ring
attention over the ranks that split each sequence, and ``apply_ddp`` wraps the model in DDP.
``parallelize`` applies a layout's functions in its order (``layouts.LAYOUTS``).

Around them, what the training loop needs from a layout: which positions of each sequence a rank
holds (``sequence_share``), whether a micro-batch's backward reduces the gradients
(``gradient_sync``), the pipeline's schedule, and the whole model gathered back from its shards.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from ..context_parallel import positions_of, ring_flash_attention
from ..gpt import GPT, answer_loss_sum
from .experts import apply_ep

# How context parallelism cuts each sequence: zig-zag (rank r of N holds chunks r and 2N-1-r of 2N)
# gives every rank the same causal attention work.
CP_LAYOUT = "zigzag"


def apply_pp(model: GPT, pp_mesh: DeviceMesh) -> None:
    """Keep this pipeline stage's share of the blocks, in place: the first stage also keeps the
    embeddings, the last the final norm and the head. The blocks of other stages become Identity,
    so that every parameter keeps its name (blocks.1.attn.q.weight on any stage), as a checkpoint
    that changes layout needs."""
    stage, stages = pp_mesh.get_local_rank(), pp_mesh.size()
    per_stage = len(model.blocks) // stages
    for i in range(len(model.blocks)):
        if i // per_stage != stage:
            model.blocks[i] = torch.nn.Identity()
    if stage > 0:
        model.tok_emb = model.pos_emb = None
    if stage < stages - 1:
        model.ln_f = model.head = None


def apply_tp(model: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> None:
    """Megatron-style tensor parallelism: in each block q, k, v and the MLP's fc split by columns
    (output features), the projections after them by rows; the head split by vocabulary, its
    logits gathered.

    Per block, forward: an all-reduce after each row-parallel projection (2); backward: one for
    the input gradient of each column-parallel layer (4: q, k, v and fc; a fused qkv would make
    it 2). With sequence parallelism, what flows between the split layers is split by position
    (dim 1 of B, T, d): each all-reduce becomes a reduce-scatter, and an all-gather before the
    next split layer (apply_sp).
    """
    between = Shard(1) if sequence_parallel else Replicate()
    parallelize_module(model, tp_mesh, {"head": ColwiseParallel(input_layouts=between, output_layouts=Replicate())})
    for block in model.blocks:
        parallelize_module(
            block,
            tp_mesh,
            {
                "attn.q": ColwiseParallel(),
                "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(),
                "attn.proj": RowwiseParallel(output_layouts=between),
                "mlp.fc": ColwiseParallel(),
                "mlp.proj": RowwiseParallel(output_layouts=between),
            },
        )
    if sequence_parallel:
        apply_sp(model, tp_mesh)


def apply_sp(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Sequence parallelism, the layers apply_tp left whole: the embeddings' outputs and the norms
    work on this rank's positions; attention and MLP gather the whole sequence at their input."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            # pos_emb's output is (T, d): its positions are dim 0.
            "pos_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
            "ln_f": SequenceParallel(),
        },
    )
    for block in model.blocks:
        parallelize_module(
            block,
            tp_mesh,
            {
                "ln1": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "ln2": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            },
        )


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh) -> None:
    """ZeRO-3 over the data-parallel ranks: each block a unit of its own (gathered for its forward
    and backward, freed after), the embeddings, final norm and head in the root's unit."""
    for block in model.blocks:
        # A pipeline stage's other blocks are Identity: nothing to shard.
        if any(True for _ in block.parameters()):
            fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    # With TP the logits come out of the gather as a view, and FSDP warns in case an in-place op on
    # them followed (it would skip FSDP's backward hook). None does: the loss only reads them.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def apply_ddp(model: GPT, dp_mesh: DeviceMesh) -> DDP:
    """Whole copies on the data-parallel ranks, gradients all-reduced in buckets during backward."""
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, process_group=dp_mesh.get_group())


def apply_cp(model: GPT, cp_mesh: DeviceMesh) -> None:
    """Context parallelism: each block's attention becomes ring attention over the cp ranks, each
    holding its zig-zag share of every sequence's positions (sequence_share); the weights stay
    whole, and DDP over cp averages their gradients. The ring is ring_flash_attention: it keeps only
    the rank's own keys and values for backward, and sends them round again there."""
    ring = functools.partial(ring_flash_attention, group=cp_mesh.get_group(), layout=CP_LAYOUT)
    for block in model.blocks:
        block.attn.attention = ring


def parallelize(model: GPT, meshes, sequence_parallel: bool = False) -> None:
    """Apply the layout's functions to the model, in the layout's order, each on its dimension of
    the mesh (meshes: layouts.Meshes). The wrapper (DDP) comes after, by wrap()."""
    on = {
        apply_pp: lambda: apply_pp(model, meshes["pp"]),
        apply_tp: lambda: apply_tp(model, meshes["tp"], sequence_parallel),
        apply_fsdp: lambda: apply_fsdp(model, meshes["dp"]),
        apply_cp: lambda: apply_cp(model, meshes["cp"]),
        # The routers count the load over every rank that trains on a share of the batch.
        apply_ep: lambda: apply_ep(model, meshes.experts["ep"], meshes["dp"].get_group()),
    }
    for apply in meshes.layout.apply:
        on[apply]()


def wrap(model: GPT, meshes) -> torch.nn.Module:
    """What the training calls: the layout's wrapper around the model (DDP over the ranks that share
    each batch), or the model itself."""
    return model if meshes.layout.wrap is None else meshes.layout.wrap(model, meshes.batch)


def sequence_share(x: torch.Tensor, y: torch.Tensor, meshes):
    """This rank's positions of each sequence (x, y and the positions) under context parallelism;
    x, y and None in the other layouts."""
    if "cp" not in meshes.dims:
        return x, y, None
    cp = meshes["cp"]
    positions = positions_of(cp.get_local_rank(), cp.size(), x.shape[1], CP_LAYOUT).to(x.device)
    return x[:, positions], y[:, positions], positions


def gradient_sync(model, wrapper, last: bool, every: bool):
    """Whether this micro-batch's backward reduces gradients over the data-parallel ranks: only the
    last one's, unless every. DDP skips its all-reduce inside no_sync(); FSDP2 skips its
    reduce-scatter and keeps the whole (unsharded) gradients until a backward with sync on."""
    sync = last or every
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
    if isinstance(wrapper, DDP) and not sync:
        return wrapper.no_sync()
    return contextlib.nullcontext()


def pipeline_schedule(
    model: GPT, meshes, device, micro_batches: int, loss_scale: dict, scale_grads: bool = False
) -> Schedule1F1B:
    """1F1B over the stages: the last stage computes each micro-batch's summed loss, scaled by
    loss_scale["factor"] (set every step); the schedule must not divide by the micro-batch count
    (scale_grads=False): the scale already divides by the global token count. scale_grads=True is
    that mistake, for a negative control (train_gpt.py --slip scale-grads)."""
    pp = meshes["pp"]
    stage = PipelineStage(model, pp.get_local_rank(), pp.size(), device, group=pp.get_group())

    def loss_fn(logits, y):
        return answer_loss_sum(logits, y)[0] * loss_scale["factor"]

    return Schedule1F1B(stage, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=scale_grads)


def whole_model(model: GPT, meshes) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered from its shards, stages and experts), on every rank: a collective."""
    # Gathering a 2d parameter takes two all-gathers, and DTensor warns so at every one; true, and
    # harmless once at the end.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mine = {n: (p.full_tensor() if isinstance(p, DTensor) else p.detach()).cpu() for n, p in model.named_parameters()}
    if meshes.size("pp") == 1 and meshes.experts is None:
        return mine
    # A pipeline stage holds its own blocks, an ep rank its own experts.
    group = meshes.mesh.get_group("pp") if meshes.experts is None else meshes.experts.get_group("ep")
    stages = [None] * dist.get_world_size(group)
    dist.all_gather_object(stages, mine, group=group)
    return {n: t for stage in stages for n, t in stage.items()}
