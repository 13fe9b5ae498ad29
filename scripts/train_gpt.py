"""Train the course's small GPT on addition in one of ten layouts: the capstone's reference script.

    python train_gpt.py --parallel single --out work/gpt_single
    torchrun --standalone --nproc_per_node=2 train_gpt.py --parallel ddp --out work/gpt_ddp
    torchrun --standalone --nproc_per_node=4 train_gpt.py --parallel 2d --sequence-parallel --out work/gpt_2d
    torchrun --standalone --nproc_per_node=4 train_gpt.py --parallel dp_pp --grad-accum 4 --out work/gpt_dp_pp
    torchrun --standalone --nproc_per_node=2 train_gpt.py --parallel ep --moe-experts 4 --out work/gpt_ep

(`--parallel fsdp`, `tp`, `pp` and `cp` run like `ddp`.) Every layout trains the same model on the same
global batches, so its per-step losses equal the single process's up to float rounding, also with
problems of mixed lengths (`--variable-length`) and gradients accumulated over micro-batches
(`--grad-accum K`). Writes metrics.json (losses, parameters and memory per rank, the sharding, the
collectives of one tensor-parallel block, the throughput: tokens/s and model FLOP/s) and final.pt
(the whole model, from rank 0) to --out. With `--mfu` every process also measures its matrix-product
peak, and the last line gives the model FLOPs utilisation against their sum.

With `--checkpoint-dir`, it saves a checkpoint every `--checkpoint-every` steps, and when the job
is preempted (SIGTERM or SIGUSR1); `--resume` continues from one in any layout and world size.
`--steps 0 --checkpoint-dir DIR` writes the initial weights only: a seed checkpoint, from which
a run starts without any rank ever holding the whole model.

A layout is a few functions applied in order by build_model: apply_pp (a pipeline stage's share
of the blocks), apply_tp (with apply_sp for sequence parallelism), then apply_fsdp or apply_ddp
over the data-parallel ranks; apply_cp makes attention ring attention over the positions each
context-parallel rank holds (sequence_share cuts them). With `--moe-experts E` every block's MLP
is a mixture of E experts (single, or ep and dp_ep: apply_ep spreads the experts over the ranks,
and all-to-alls carry the tokens to them and back). The model and the task come from the
course's package (parallel_course.gpt), shared with the notebook and the labs; the process group
from dist_setup.py, which must sit beside this file.
"""

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_setup import setup, teardown
from parallel_course.context_parallel import AllToAll, positions_of, ring_attention
from parallel_course.gpt import GPT, IGNORE, AdditionTask, GPTConfig, MoE, answer_loss_sum
from parallel_course.planner import flops_per_token
from parallel_course.throughput import describe, measure_matmul_peak, summary

LAYOUTS = ("single", "ddp", "fsdp", "tp", "2d", "pp", "dp_pp", "cp", "ep", "dp_ep")
# Tensor-parallel ranks per data-parallel group in the 2d layout.
TP_SIZE_2D = 2
# Pipeline stages in pp and dp_pp: the model's blocks are split evenly over them.
PP_STAGES = 2
# Context-parallel ranks in cp, and how the sequence is cut between them: zig-zag (rank r holds
# chunks r and 2N-1-r of 2N) gives every rank the same causal attention work.
CP_SIZE, CP_LAYOUT = 2, "zigzag"
# The layouts that spread a mixture of experts over the ranks, and the expert-parallel ranks in dp_ep.
EP_LAYOUTS, EP_SIZE_DP_EP = ("ep", "dp_ep"), 2
# The signals a scheduler sends before it stops a job (SLURM: scancel --signal, #SBATCH --signal).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STEP_FOLDER = re.compile(r"step-(\d+)$")


def mesh_shape(layout: str, world_size: int) -> tuple[int, int, int]:
    """(data-parallel, pipeline, tensor-parallel) sizes of a layout on world_size processes."""
    shapes = {
        "tp": (1, 1, world_size),
        "2d": (world_size // TP_SIZE_2D, 1, TP_SIZE_2D),
        "pp": (1, world_size, 1),
        "dp_pp": (world_size // PP_STAGES, PP_STAGES, 1),
    }
    return shapes.get(layout, (world_size, 1, 1))


def mesh_dims(layout: str, world_size: int) -> dict[str, int]:
    """The device mesh of a layout, its dimensions' names and sizes in order: dp, pp, tp, and cp
    only in the cp layout (the sequence split over CP_SIZE ranks, no data parallelism)."""
    if layout == "cp":
        return {"dp": 1, "pp": 1, "cp": world_size, "tp": 1}
    return dict(zip(("dp", "pp", "tp"), mesh_shape(layout, world_size)))


def batch_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that share each global batch and average their gradients: dp (rows of the batch),
    or cp (positions of each sequence) in the cp layout."""
    return mesh["cp"] if "cp" in (mesh.mesh_dim_names or ()) else mesh["dp"]


def sequence_share(x: torch.Tensor, y: torch.Tensor, mesh: DeviceMesh):
    """This rank's positions of each sequence (x, y and the positions) under context parallelism;
    x, y and None in the other layouts."""
    if "cp" not in (mesh.mesh_dim_names or ()):
        return x, y, None
    positions = positions_of(mesh["cp"].get_local_rank(), mesh["cp"].size(), x.shape[1], CP_LAYOUT).to(x.device)
    return x[:, positions], y[:, positions], positions


def expert_mesh_shape(layout: str, world_size: int) -> tuple[int, int]:
    """(expert data-parallel, expert-parallel) sizes: ep spreads the experts over every rank, dp_ep
    over groups of EP_SIZE_DP_EP, each group a replica of all experts. The rest of the model is
    data-parallel over every rank in both (mesh_shape: dp is the world)."""
    ep = world_size if layout == "ep" else EP_SIZE_DP_EP
    return world_size // ep, ep


def checkpoint_step(folder: Path) -> int | None:
    """The step a checkpoint folder holds (step-000004 holds step 4), None if it holds none:
    torch.distributed.checkpoint writes .metadata last, once every rank has written its part."""
    match = STEP_FOLDER.search(folder.name)
    return int(match.group(1)) if match and (folder / ".metadata").is_file() else None


def latest_checkpoint(path: Path) -> Path | None:
    """A checkpoint folder itself, or the newest complete checkpoint inside a --checkpoint-dir."""
    if checkpoint_step(path) is not None:
        return path
    found = [f for f in path.glob("step-*") if checkpoint_step(f) is not None] if path.is_dir() else []
    return max(found, key=checkpoint_step, default=None)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a small GPT on addition: single, DDP, FSDP, TP, FSDP x TP, pipeline, DP x pipeline, "
        "context parallel, expert parallel (a mixture of experts), DP x expert parallel."
    )
    parser.add_argument("--parallel", choices=LAYOUTS, default="single", help="the layout (default: single)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of the whole training")
    parser.add_argument("--seed", type=int, default=0, help="fixes the initial weights and the data")
    parser.add_argument(
        "--global-batch-size", type=int, default=64, help="problems per optimizer step, all micro-batches and ranks"
    )
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--digits", type=int, default=2, help="digits of each number added (1 to 4)")
    parser.add_argument(
        "--variable-length", action="store_true", help="problems of 1 to --digits digits, padded: token counts vary"
    )
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=None,
        metavar="K",
        help="micro-batches per optimizer step (default 1; pp, dp_pp: the pipeline's, default 2 per stage)",
    )
    parser.add_argument(
        "--sync-every-micro-batch",
        action="store_true",
        help="ddp, fsdp, 2d: reduce gradients after every micro-batch, not only the last",
    )
    parser.add_argument(
        "--moe-experts",
        type=int,
        default=0,
        metavar="E",
        help="a mixture of E expert MLPs in every block (default 0: the dense MLP); single, ep, dp_ep",
    )
    parser.add_argument("--top-k", type=int, default=2, metavar="K", help="--moe-experts: experts a token uses")
    parser.add_argument(
        "--capacity-factor",
        type=float,
        default=1.25,
        metavar="C",
        help="--moe-experts: an expert takes C x tokens x K / E of a forward's tokens, drops the rest (default 1.25)",
    )
    parser.add_argument(
        "--aux-loss-weight",
        type=float,
        default=0.01,
        metavar="W",
        help="--moe-experts: the load-balancing loss's weight in the training loss (default 0.01)",
    )
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    parser.add_argument("--sequence-parallel", action="store_true", help="tp, 2d: split activations by position")
    parser.add_argument("--checkpoint-dir", type=Path, help="save checkpoints (step-NNNNNN folders) here")
    parser.add_argument(
        "--checkpoint-every", type=int, default=None, metavar="K", help="save every K steps (default: at the end)"
    )
    parser.add_argument("--async-checkpoint", action="store_true", help="save in the background (dcp.async_save)")
    parser.add_argument("--resume", type=Path, help="a checkpoint, or a --checkpoint-dir: continue from its newest")
    parser.add_argument(
        "--resume-weights-only", action="store_true", help="with --resume: the weights, not the optimizer's state"
    )
    parser.add_argument(
        "--mfu",
        action="store_true",
        help="measure each process's float32 matmul peak after training, print the throughput and MFU (rank 0)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for metrics.json and final.pt")
    args = parser.parse_args(argv)
    # Checked before the group is joined: a bad request is one line, before anything starts.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.steps < 0 or args.global_batch_size < 1:
        parser.error("--steps must be at least 0 and --global-batch-size at least 1")
    if args.steps == 0 and args.checkpoint_dir is None:
        parser.error("--steps 0 trains nothing: add --checkpoint-dir to write a seed checkpoint (the initial weights)")
    # The sequence must fit the model's 16 positions.
    if not 1 <= args.digits <= 4:
        parser.error(f"--digits must be 1 to 4, got {args.digits}")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.parallel == "single" and world_size > 1:
        parser.error(f"--parallel single is one process, but the world size is {world_size}")
    if args.parallel == "2d" and (world_size < 2 * TP_SIZE_2D or world_size % TP_SIZE_2D):
        parser.error(f"--parallel 2d needs an even world size of at least {2 * TP_SIZE_2D}, got {world_size}")
    if args.parallel == "pp" and world_size != PP_STAGES:
        parser.error(
            f"--parallel pp runs {PP_STAGES} pipeline stages, one per process, but the world size is {world_size}"
        )
    if args.parallel == "dp_pp" and (world_size < 2 * PP_STAGES or world_size % PP_STAGES):
        parser.error(
            f"--parallel dp_pp needs a multiple of {PP_STAGES} processes, at least {2 * PP_STAGES}, got {world_size}"
        )
    if args.parallel == "cp" and world_size != CP_SIZE:
        parser.error(f"--parallel cp splits each sequence over {CP_SIZE} processes, but the world size is {world_size}")
    seq_len = AdditionTask(args.digits).seq_len
    if args.parallel == "cp" and seq_len % (2 * CP_SIZE):
        parser.error(
            f"--parallel cp cuts each sequence into {2 * CP_SIZE} equal zig-zag chunks: "
            f"--digits {args.digits} gives {seq_len} tokens (--digits 2 gives 8)"
        )
    if args.moe_experts < 0:
        parser.error(f"--moe-experts must be at least 0 (0: the dense MLP), got {args.moe_experts}")
    if args.moe_experts and args.parallel not in ("single", *EP_LAYOUTS):
        parser.error(f"--moe-experts runs with --parallel single, ep or dp_ep, got {args.parallel}")
    if args.moe_experts and not 1 <= args.top_k <= args.moe_experts:
        parser.error(f"--top-k must be 1 to the {args.moe_experts} experts, got {args.top_k}")
    if not args.capacity_factor > 0 or not args.aux_loss_weight >= 0:
        parser.error("--capacity-factor must be above 0 and --aux-loss-weight at least 0")
    if args.parallel in EP_LAYOUTS and not args.moe_experts:
        parser.error(f"--parallel {args.parallel} spreads experts over the ranks: add --moe-experts E")
    if args.parallel == "ep" and world_size < 2:
        parser.error("--parallel ep spreads the experts over the processes: it needs at least 2, got 1")
    if args.parallel == "dp_ep" and (world_size < 2 * EP_SIZE_DP_EP or world_size % EP_SIZE_DP_EP):
        parser.error(
            f"--parallel dp_ep needs a multiple of {EP_SIZE_DP_EP} processes, at least {2 * EP_SIZE_DP_EP}, "
            f"got {world_size}"
        )
    if args.parallel in EP_LAYOUTS and args.moe_experts % expert_mesh_shape(args.parallel, world_size)[1]:
        ep = expert_mesh_shape(args.parallel, world_size)[1]
        parser.error(f"--parallel {args.parallel}: the {args.moe_experts} experts do not divide over {ep} ranks")
    if args.parallel in EP_LAYOUTS and (args.checkpoint_dir or args.resume):
        parser.error(f"--parallel {args.parallel} saves no checkpoints yet: drop --checkpoint-dir and --resume")
    dims = mesh_dims(args.parallel, world_size)
    dp, pp, tp = dims["dp"], dims["pp"], dims["tp"]
    heads = GPTConfig().n_heads
    # Each tensor-parallel rank computes whole heads.
    if heads % tp:
        parser.error(
            f"--parallel {args.parallel} splits the {heads} attention heads over {tp} ranks: "
            f"use a world size that divides {heads}"
        )
    if args.sequence_parallel and args.parallel not in ("tp", "2d"):
        parser.error(f"--sequence-parallel needs --parallel tp or 2d, got {args.parallel}")
    if args.grad_accum is None:
        args.grad_accum = 2 * pp if pp > 1 else 1
    if args.grad_accum < 1:
        parser.error(f"--grad-accum must be at least 1, got {args.grad_accum}")
    # Schedule1F1B refuses fewer micro-batches than stages.
    if pp > 1 and args.grad_accum < pp:
        parser.error(f"--parallel {args.parallel}: the pipeline's {pp} stages need --grad-accum {pp} or more")
    if args.global_batch_size % (dp * args.grad_accum):
        parser.error(
            f"--global-batch-size {args.global_batch_size} is not divisible by the {dp} data-parallel ranks "
            f"x {args.grad_accum} micro-batches"
        )
    if args.sync_every_micro_batch and args.parallel not in ("ddp", "fsdp", "2d"):
        parser.error(f"--sync-every-micro-batch needs --parallel ddp, fsdp or 2d, got {args.parallel}")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
    if (args.checkpoint_every or args.async_checkpoint) and args.checkpoint_dir is None:
        parser.error("--checkpoint-every and --async-checkpoint need --checkpoint-dir")
    if args.checkpoint_dir is not None and args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        parser.error(f"--checkpoint-dir {args.checkpoint_dir} exists and is not a folder")
    args.start_step = 0
    if args.resume is not None:
        found = latest_checkpoint(args.resume)
        if found is None:
            parser.error(f"--resume {args.resume}: no checkpoint there (no step-NNNNNN folder with a .metadata file)")
        args.resume, args.start_step = found, checkpoint_step(found)
        if args.start_step >= args.steps:
            parser.error(f"--resume {found} is at step {args.start_step}: nothing left of --steps {args.steps}")
    if args.resume_weights_only and args.resume is None:
        parser.error("--resume-weights-only needs --resume")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    return args


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank stores: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


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


def apply_ddp(model: GPT, dp_mesh: DeviceMesh, device: torch.device) -> DDP:
    """Whole copies on the data-parallel ranks, gradients all-reduced in buckets during backward."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, process_group=dp_mesh.get_group())


def apply_cp(model: GPT, cp_mesh: DeviceMesh) -> None:
    """Context parallelism: each block's attention becomes ring attention over the cp ranks, each
    holding its zig-zag share of every sequence's positions (sequence_share); the weights stay
    whole, and DDP over cp averages their gradients."""
    ring = functools.partial(ring_attention, group=cp_mesh.get_group(), layout=CP_LAYOUT)
    for block in model.blocks:
        block.attn.attention = ring


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


def dispatch(experts, args, group):
    """Before the experts: every rank's (E, capacity, d) slots become this rank's experts' slots from
    every rank, (E/R, R x capacity, d). Rank j receives the slots of its experts, padding included."""
    size = dist.get_world_size(group)
    slots = AllToAll.apply(args[0], group)
    n_experts, capacity, d = slots.shape
    # Received: R blocks (one per sender) of E/R experts; each expert's slots from all senders together.
    mine = slots.view(size, n_experts // size, capacity, d).transpose(0, 1)
    return (mine.reshape(n_experts // size, size * capacity, d),)


def combine(experts, args, out, group):
    """After the experts: their outputs go back to the ranks whose tokens they are, (E, capacity, d)."""
    size = dist.get_world_size(group)
    local, slots, d = out.shape
    back = out.view(local, size, slots // size, d).transpose(0, 1).reshape(local * size, slots // size, d)
    return AllToAll.apply(back, group)


def apply_ep(model: GPT, ep_mesh: DeviceMesh, data_group) -> None:
    """Expert parallelism: rank r of an ep group of R keeps experts r E/R to (r+1) E/R - 1 of every
    block (the others become Identity, so that names stay as in one process). Each rank routes its
    own tokens into (E, capacity, d) slots as one process would; an all-to-all sends every expert's
    slots to its rank (dispatch), another brings the outputs back (combine). The routers count the
    load over data_group, every rank that trains on a share of the batch."""
    rank, size, group = ep_mesh.get_local_rank(), ep_mesh.size(), ep_mesh.get_group()
    for block in model.blocks:
        moe, per_rank = block.mlp, len(block.mlp.experts) // size
        moe.experts.local = list(range(rank * per_rank, (rank + 1) * per_rank))
        for e in range(len(moe.experts)):
            if e not in moe.experts.local:
                moe.experts[e] = torch.nn.Identity()
        moe.group = data_group
        moe.experts.register_forward_pre_hook(functools.partial(dispatch, group=group))
        moe.experts.register_forward_hook(functools.partial(combine, group=group))


def reduce_expert_gradients(model: GPT, dp_group, expert_dp_group) -> None:
    """ep, dp_ep: the gradients averaged by hand after backward (the loss is scaled as for DDP).
    The dense weights' are summed over every rank; an expert's already holds its whole ep group's
    tokens (the all-to-all's backward brought them) and is summed over its replicas only. Both are
    divided by the world size: DDP's average. One all-reduce per group, over flattened gradients."""
    world_size = dist.get_world_size()
    dense = [p.grad for n, p in model.named_parameters() if ".experts." not in n and p.grad is not None]
    experts = [p.grad for n, p in model.named_parameters() if ".experts." in n and p.grad is not None]
    for grads, group in ((dense, dp_group), (experts, expert_dp_group)):
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=group)
        for g, part in zip(grads, flat.div_(world_size).split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


class ExpertLoad:
    """A mixture of experts' bookkeeping in one step. After each forward: the load-balancing loss to
    add to the training loss (--aux-loss-weight times its mean over the layers, per micro-batch,
    scaled by the dp size as the language-model loss is), and the choices routed to and dropped by
    each expert, summed over the micro-batches (each layer counts the tokens of every data rank).
    The statistics are a micro-batch's, over every data rank: with --grad-accum above 1, one process
    and ep group the rows into micro-batches differently, and their auxiliary losses differ a little."""

    def __init__(self, model: GPT, args, dp_group):
        self.model = model
        self.layers = [m for m in model.modules() if isinstance(m, MoE)]
        self.weight = args.aux_loss_weight * dist.get_world_size(dp_group) / args.grad_accum
        self.dp_group, self.micro_batches = dp_group, args.grad_accum
        self.aux, self.routed, self.dropped = 0.0, 0, 0

    def after_forward(self) -> torch.Tensor:
        share = sum(m.aux_loss for m in self.layers) / len(self.layers)
        self.aux += share.detach()
        self.routed = self.routed + torch.stack([m.routed for m in self.layers])
        self.dropped = self.dropped + torch.stack([m.dropped for m in self.layers])
        return share * self.weight

    def __str__(self) -> str:
        """What the step's log line adds, once step() has run."""
        return f", aux loss {self.aux_loss:.4f}"

    def step(self, experts=None) -> dict:
        """After backward: in ep and dp_ep (experts: the expert mesh) the gradients reduced by hand
        first (reduce_expert_gradients). Returns the step's auxiliary loss (this rank's shares summed
        over the ranks, averaged over the micro-batches), the norm of the whole model's reduced
        gradient (an ep rank holds the dense part whole and its own experts: theirs summed over the ep
        group), and, per layer and expert, the routed and dropped choices."""
        if experts is not None:
            reduce_expert_gradients(self.model, self.dp_group, experts.get_group("expert_dp"))
        dist.all_reduce(self.aux, group=self.dp_group)
        squares = [torch.zeros((), device=self.aux.device) for _ in range(2)]
        for name, p in self.model.named_parameters():
            squares[".experts." in name] += p.grad.pow(2).sum() if p.grad is not None else 0
        if experts is not None:
            dist.all_reduce(squares[1], group=experts.get_group("ep"))
        self.aux_loss = self.aux.item() / self.micro_batches
        return {
            "aux_loss": self.aux_loss,
            "gradient_norm": (squares[0] + squares[1]).sqrt().item(),
            "routed": self.routed.tolist(),
            "dropped": self.dropped.tolist(),
        }


def build_model(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device, experts=None) -> GPT:
    """The GPT in the chosen layout (a DDP layout is wrapped later, by apply_ddp). Pipeline stage
    first, then TP, then FSDP over dp, which shards the TP-local parameters further.

    Made whole from the seed, before any sharding: the same initial weights in every layout. With
    --resume it is built on the meta device instead (shapes, no storage), laid out, and only then
    given memory on this device, for the checkpoint to fill in: no rank ever holds the whole model.
    experts: the (expert dp, ep) mesh of ep and dp_ep.
    """
    torch.manual_seed(args.seed)
    with torch.device("meta") if args.resume else contextlib.nullcontext():
        cfg = GPTConfig(moe_experts=args.moe_experts, top_k=args.top_k, capacity_factor=args.capacity_factor)
        model = GPT(cfg, activation_checkpointing=args.activation_checkpointing)
    if args.resume is None:
        model.to(device)
    if args.parallel in ("pp", "dp_pp"):
        apply_pp(model, mesh["pp"])
    if args.parallel in ("tp", "2d"):
        apply_tp(model, mesh["tp"], args.sequence_parallel)
    if args.parallel in ("fsdp", "2d", "dp_pp"):
        apply_fsdp(model, mesh["dp"])
    if args.parallel == "cp":
        apply_cp(model, mesh["cp"])
    if experts is not None:
        apply_ep(model, experts["ep"], mesh.get_group("dp"))
    if args.resume:
        model.to_empty(device=device)
    return model


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


def held_gradient_bytes(model) -> int:
    """Bytes of gradient this rank holds now: .grad (a shard under FSDP), plus the whole gradients
    FSDP2 keeps between micro-batches while it does not reduce them (torch's internal bookkeeping,
    read here only to measure; on a torch whose internals differ, .grad alone, with a note)."""
    held = nbytes(p.grad for p in model.parameters() if p.grad is not None)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # fsdp_whole_gradients (at the end of this file): None where the internals differ.
            whole = fsdp_whole_gradients(module)
            if whole is None:
                return held
            held += nbytes(whole)
    return held


def pipeline_schedule(model: GPT, mesh: DeviceMesh, device, micro_batches: int, loss_scale: dict) -> Schedule1F1B:
    """1F1B over the stages: the last stage computes each micro-batch's summed loss, scaled by
    loss_scale["factor"] (set every step); the schedule must not divide by the micro-batch count
    (scale_grads=False): the scale already divides by the global token count."""
    pp = mesh["pp"]
    stage = PipelineStage(model, pp.get_local_rank(), pp.size(), device, group=pp.get_group())

    def loss_fn(logits, y):
        return answer_loss_sum(logits, y)[0] * loss_scale["factor"]

    return Schedule1F1B(stage, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=False)


class SavedActivations:
    """Bytes of the tensors autograd keeps for backward (parameters excluded, views of one storage
    once): a CPU has no allocator statistics; on a GPU, torch.cuda.max_memory_allocated has it all."""

    def __init__(self, model):
        self.model, self.storages, self.bytes = model, set(), 0

    def pack(self, t):
        storage = local(t).untyped_storage()
        # The parameters as they are now: FSDP swaps in the whole ones only around a block's forward.
        weights = {local(p).untyped_storage().data_ptr() for p in self.model.parameters()}
        # Weights, or views of them, are no activations.
        if storage.data_ptr() not in weights | self.storages:
            self.storages.add(storage.data_ptr())
            self.bytes += storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def block_collectives(comms) -> dict:
    """The collectives of the first block in a step CommDebugMode watched, by phase; {} if none did."""
    if not isinstance(comms, CommDebugMode):
        return {}
    block = next(counts for name, counts in comms.comm_module_counts.items() if name.endswith("blocks.0"))
    return {phase: {str(op): n for op, n in block[phase].items()} for phase in block}


def training_state(model: GPT, optimizer, step: int, data: torch.Generator, weights_only: bool = False) -> dict:
    """What a checkpoint holds, by parameter name: the same names in every layout, each rank
    saving and loading only its shard. The data generator's state is the position in the data
    (every rank draws every global batch, so it is the same on all)."""
    if weights_only:
        model_state, _ = get_state_dict(model, [])
        state = {"model": model_state}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        # Hyperparameters come from this run's command line, not the checkpoint: a pipeline stage's
        # optimizer lists only its own parameters there.
        optim_state.pop("param_groups")
        state = {"model": model_state, "optim": optim_state}
    state["train"] = {"step": torch.tensor(step), "data_rng": data.get_state()}
    return state


def load_checkpoint(args, model, optimizer, data) -> None:
    """Fill the model (and optimizer, data position) from --resume, each rank reading its shards,
    whatever layout and world size wrote it."""
    weights_only = args.resume_weights_only or args.start_step == 0
    state = training_state(model, optimizer, 0, data, weights_only)
    dcp.load(state, checkpoint_id=args.resume)
    if weights_only:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        state["optim"]["param_groups"] = get_state_dict(model, optimizer)[1]["param_groups"]
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    data.set_state(state["train"]["data_rng"])


class Preemption:
    """Turns SIGTERM or SIGUSR1 into "save and stop after this step". The handler only notes the
    signal; at the end of each step the ranks agree (a signal may reach them at different moments)."""

    def __init__(self, device: torch.device):
        self.received, self.device = 0, device
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, self.note)

    def note(self, signum, frame):
        self.received = signum

    def agreed(self) -> int:
        """The signal any rank received (0 if none): the same answer on every rank."""
        # On the training's device: nccl reduces only GPU tensors.
        flag = torch.tensor([self.received], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


class Checkpoints:
    """--checkpoint-dir's saves: every --checkpoint-every steps, at the end, and on a preemption."""

    def __init__(self, args, device: torch.device):
        self.args, self.pending, self.saves = args, None, []
        self.every = args.checkpoint_every or args.steps
        self.preemption = Preemption(device) if args.checkpoint_dir else None
        # A background save runs collectives from its own thread: on a group of its own, or they
        # would interleave with the training's on the same group and hang. Gloo, even beside nccl:
        # the save plans travel between CPUs.
        self.group = dist.new_group(backend="gloo") if args.async_checkpoint else None

    def after_step(self, step: int, model, optimizer, data) -> int:
        """Save if step (the steps done) is due; returns the signal that stops the run, or 0."""
        if self.preemption is None:
            return 0
        # A signal in the last step stops nothing: the run ends with this step anyway, and writes its
        # metrics (a requeued job would find nothing left to train).
        stop = self.preemption.agreed() if step < self.args.steps else 0
        if step % self.every == 0 or step == self.args.steps or stop:
            self.save(step, model, optimizer, data)
        if stop:
            self.wait()
            if dist.get_rank() == 0:
                folder = self.args.checkpoint_dir
                sys.stdout.write(
                    f"preempted by {signal.Signals(stop).name} after step {step} of {self.args.steps}: saved "
                    f"{folder / f'step-{step:06d}'}; continue with --resume {folder}\n"
                )
        return stop

    def save(self, step: int, model, optimizer, data) -> None:
        """Save to --checkpoint-dir/step-NNNNNN, after the previous background save has finished."""
        self.wait()
        start = time.perf_counter()
        state = training_state(model, optimizer, step, data, weights_only=step == 0)
        folder = self.args.checkpoint_dir / f"step-{step:06d}"
        if self.args.async_checkpoint:
            # Copies the state to memory now, writes it from a thread: training goes on meanwhile.
            self.pending = dcp.async_save(state, checkpoint_id=folder, process_group=self.group)
        else:
            dcp.save(state, checkpoint_id=folder)
        waited = time.perf_counter() - start
        self.saves.append({"step": step, "training_waited_s": waited})
        if dist.get_rank() == 0:
            how = "in the background" if self.args.async_checkpoint else "blocking"
            sys.stdout.write(f"checkpoint of step {step} ({how}): training waited {waited:.3f} s\n")

    def wait(self) -> None:
        """Until the background save is written: before the next one, and before the process ends."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None


def forward_backward(
    args, model, wrapper, x, y, scale: float, comms, positions=None, load=None
) -> tuple[torch.Tensor, int]:
    """Forward and backward of this rank's share of the batch, micro-batch by micro-batch, each
    summed loss times scale; returns the summed loss and the most gradient bytes held between
    micro-batches. comms (a CommDebugMode, or nothing) watches the first micro-batch. positions:
    the places in the sequence of x's tokens (None: all, in order). load: a mixture of experts'
    ExpertLoad, which adds the load-balancing loss."""
    loss_sum, held = torch.zeros((), device=x.device), 0
    micro = list(zip(x.chunk(args.grad_accum), y.chunk(args.grad_accum)))
    for i, (x_i, y_i) in enumerate(micro):
        last = i == len(micro) - 1
        watch = comms if i == 0 else contextlib.nullcontext()
        with watch, gradient_sync(model, wrapper, last, args.sync_every_micro_batch):
            micro_sum, _ = answer_loss_sum(wrapper(x_i, positions), y_i)
            aux = load.after_forward() if load is not None else 0.0
            (micro_sum * scale + aux).backward()
        loss_sum += micro_sum.detach()
        if not last:
            held = max(held, held_gradient_bytes(model))
    return loss_sum, held


def pipeline_forward_backward(schedule, first_stage: bool, x, y, scale: float, loss_scale: dict) -> torch.Tensor:
    """One step of the 1F1B schedule on this stage; returns the summed loss (0 on the first stage:
    the loss exists on the last)."""
    loss_scale["factor"] = scale
    if first_stage:
        schedule.step(x)
        return torch.zeros((), device=x.device)
    # The scaled loss of each micro-batch: their sum over the scale is the summed loss.
    scaled = []
    schedule.step(target=y, losses=scaled)
    return sum(scaled) / scale


def make_optimizer(model, lr: float) -> torch.optim.AdamW:
    """AdamW over every parameter of this rank."""
    # On a GPU, AdamW updates every parameter in one foreach kernel, which cannot mix DTensors with
    # plain tensors: in the tp layout the embeddings and norms stay plain beside the sharded weights.
    mixed = len({isinstance(p, DTensor) for p in model.parameters()}) > 1
    return torch.optim.AdamW(model.parameters(), lr=lr, foreach=False if mixed else None)


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


def throughput(args, step_times_s: list[float], device: torch.device) -> dict:
    """The run's throughput (parallel_course.throughput.summary): tokens per step and model FLOPs per
    token of the whole global batch (planner.flops_per_token: 6 x the matmul weights a token uses,
    plus attention), the median step after the first. With --mfu, each process's matmul peak, measured
    now while the others measure theirs (the cores are shared as in training): a collective."""
    cfg, seq_len = GPTConfig(moe_experts=args.moe_experts, top_k=args.top_k), AdditionTask(args.digits).seq_len
    per_token = flops_per_token(
        layers=cfg.n_layers,
        hidden=cfg.d_model,
        seq_len=seq_len,
        vocab=cfg.vocab_size,
        ffn=cfg.mlp_ratio * cfg.d_model,
        moe_experts=cfg.moe_experts,
        top_k=cfg.top_k,
    )
    peaks = None
    if args.mfu:
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, measure_matmul_peak(device=device).flops_per_s)
    return summary(args.global_batch_size * seq_len, step_times_s, per_token, peaks)


def train(args, model, wrapper, mesh, device, experts=None):
    """The training loop from --resume's step (or 0) to --steps; returns the global mean loss of
    every step it trained, this rank's memory, the collectives of one block in its first step, what
    checkpointing cost, each step's ExpertLoad (experts: ep's expert mesh) and time (None if preempted)."""
    task = AdditionTask(args.digits, args.variable_length)
    # Every rank draws every global batch, and trains on its data-parallel share of it.
    data = torch.Generator().manual_seed(args.seed + 1)
    dp_size, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    per_rank = args.global_batch_size // dp_size
    optimizer = make_optimizer(model, args.lr)
    clock = StepClock(optimizer, device)
    if args.resume:
        load_checkpoint(args, model, optimizer, data)
    pipelined, loss_scale = mesh["pp"].size() > 1, {}
    if pipelined:
        schedule = pipeline_schedule(model, mesh, device, args.grad_accum, loss_scale)
    checkpoints = Checkpoints(args, device)
    losses, memory, collectives, expert_steps = [], {"parameter_bytes": nbytes(model.parameters())}, {}, []
    log_every = max(1, args.steps // 10)
    # The module hooks that count collectives (step 1, below) warn that the token ids need no gradient.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
    for step in range(args.start_step, args.steps):
        x, y = task.batch(data, args.global_batch_size)
        x, y = (t[dp_rank * per_rank : (dp_rank + 1) * per_rank].to(device) for t in (x, y))
        x, y, positions = sequence_share(x, y, mesh)
        # The loss is the mean over every answer token of the global batch: counted before any
        # backward (it varies with --variable-length), and each micro-batch's summed loss scaled by
        # it. DDP and FSDP average gradients over the ranks sharing the batch (dp, or cp), hence their number.
        global_count = (y != IGNORE).sum()
        dist.all_reduce(global_count, group=batch_mesh(mesh).get_group())
        scale = batch_mesh(mesh).size() / global_count.item()
        saved, first = SavedActivations(model), step == args.start_step
        load = ExpertLoad(model, args, batch_mesh(mesh).get_group()) if args.moe_experts else None
        # The first step of a tensor-parallel layout also counts the collectives of every module.
        comms = CommDebugMode() if first and mesh["tp"].size() > 1 else contextlib.nullcontext()
        # Counted in the first step only: the hook looks at every saved tensor, and costs time.
        with saved.hooks() if first else contextlib.nullcontext():
            if pipelined:
                first_stage = mesh["pp"].get_local_rank() == 0
                loss_sum, held = pipeline_forward_backward(schedule, first_stage, x, y, scale, loss_scale), 0
            else:
                loss_sum, held = forward_backward(args, model, wrapper, x, y, scale, comms, positions, load)
        if first:
            memory["gradient_bytes"] = nbytes(p.grad for p in model.parameters() if p.grad is not None)
            memory["gradient_bytes_between_micro_batches"] = held
            memory["activation_bytes"] = saved.bytes
            collectives = block_collectives(comms)
        # A mixture of experts: ep's gradients reduced by hand, the step's load and auxiliary loss noted.
        expert_steps += [load.step(experts)] if load is not None else []
        optimizer.step()
        optimizer.zero_grad()
        if pipelined:
            # Only the last stage computed the loss: every rank reports it.
            dist.broadcast(loss_sum, group=mesh.get_group("pp"), group_src=mesh["pp"].size() - 1)
        # The tp ranks of a group hold the same loss: summed over dp (or cp) only.
        dist.all_reduce(loss_sum, group=batch_mesh(mesh).get_group())
        losses.append(loss_sum.item() / global_count.item())
        if dist.get_rank() == 0 and ((step + 1) % log_every == 0 or first):
            # A mixture of experts adds its auxiliary loss to the line.
            sys.stdout.write(f"step {step + 1}/{args.steps}: loss {losses[-1]:.4f}{load or ''}\n")
            sys.stdout.flush()
        if checkpoints.after_step(step + 1, model, optimizer, data):
            return None
    if args.steps == 0:
        checkpoints.save(0, model, optimizer, data)
    checkpoints.wait()
    memory["optimizer_state_bytes"] = nbytes(
        t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    )
    return losses, memory, collectives, checkpoints.saves, expert_steps, clock.step_times_s


def whole_model(model: GPT, mesh: DeviceMesh, experts=None) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered from its shards and stages), on every rank: a collective."""
    # Gathering a 2d parameter takes two all-gathers, and DTensor warns so at every one; true, and
    # harmless once at the end.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mine = {n: (p.full_tensor() if isinstance(p, DTensor) else p.detach()).cpu() for n, p in model.named_parameters()}
    if mesh["pp"].size() == 1 and experts is None:
        return mine
    # A pipeline stage holds its own blocks, an ep rank its own experts.
    group = mesh.get_group("pp") if experts is None else experts.get_group("ep")
    stages = [None] * dist.get_world_size(group)
    dist.all_gather_object(stages, mine, group=group)
    return {n: t for stage in stages for n, t in stage.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dims = mesh_dims(args.parallel, world_size)
    dp, pp, tp, cp = dims["dp"], dims["pp"], dims["tp"], dims.get("cp", 1)
    mesh = init_device_mesh(device.type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    expert_dp, ep = expert_mesh_shape(args.parallel, world_size)
    experts = None
    if args.parallel in EP_LAYOUTS:
        experts = init_device_mesh(device.type, (expert_dp, ep), mesh_dim_names=("expert_dp", "ep"))
    model = build_model(args, mesh, device, experts)
    wrapper = apply_ddp(model, batch_mesh(mesh), device) if args.parallel in ("ddp", "cp") else model
    # A DTensor's numel() is the whole parameter's; a pipeline stage holds only its own.
    count = torch.tensor(sum(p.numel() for p in model.parameters()), device=device)
    dist.all_reduce(count, group=mesh.get_group("pp"))
    total = int(count)
    if rank == 0:
        start = f", resumed from {args.resume} (step {args.start_step})" if args.resume else ""
        cp_factor = f" x cp {cp}" if cp > 1 else ""
        sys.stdout.write(
            f"{args.parallel}: backend={dist.get_backend()} device={device.type} world_size={world_size} "
            f"(dp {dp} x pp {pp} x tp {tp}{cp_factor}), global batch {args.global_batch_size} in {args.grad_accum} "
            f"micro-batch{'es' if args.grad_accum > 1 else ''}{start}\n"
        )
        if args.moe_experts:
            spread = f", spread over ep {ep} x expert dp {expert_dp}" if experts is not None else ""
            sys.stdout.write(
                f"mixture of {args.moe_experts} experts, top-{args.top_k}, capacity factor {args.capacity_factor}"
                f"{spread}\n"
            )
    trained = train(args, model, wrapper, mesh, device, experts)
    if trained is None:
        # Preempted: the checkpoint is the result.
        return 0
    losses, memory, collectives, saves, expert_steps, step_times_s = trained
    if args.steps == 0:
        if rank == 0:
            sys.stdout.write(f"seed checkpoint: the initial weights in {args.checkpoint_dir / 'step-000000'}\n")
        return 0

    figures = throughput(args, step_times_s, device)
    mine = {"local_parameters": sum(local(p).numel() for p in model.parameters()), **memory}
    # Each rank's own figures, in rank order.
    every = [None] * world_size
    dist.all_gather_object(every, mine)
    placements = {n: str(p.placements) if isinstance(p, DTensor) else "whole" for n, p in model.named_parameters()}
    full = whole_model(model, mesh, experts)
    if experts is not None:
        # The experts are spread over the ep ranks: counted whole.
        total = sum(t.numel() for t in full.values())
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(full, args.out / "final.pt")
        metrics = {
            "parallel": args.parallel,
            "world_size": world_size,
            "mesh": dims,
            "steps": args.steps,
            "start_step": args.start_step,
            "seed": args.seed,
            "global_batch_size": args.global_batch_size,
            "grad_accum": args.grad_accum,
            "variable_length": args.variable_length,
            "activation_checkpointing": args.activation_checkpointing,
            "losses": losses,
            "total_parameters": total,
            "local_parameters": [m.pop("local_parameters") for m in every],
            "memory": every,
            "placements": placements,
            "sequence_parallel": args.sequence_parallel,
            "collectives_per_block": collectives,
            "checkpoints": saves,
            "throughput": figures,
        }
        if args.moe_experts:
            metrics["moe"] = {
                "experts": args.moe_experts,
                "top_k": args.top_k,
                "capacity_factor": args.capacity_factor,
                "aux_loss_weight": args.aux_loss_weight,
                "expert_mesh": {"expert_dp": expert_dp, "ep": ep} if experts is not None else None,
            }
            # Per step: the load-balancing loss (not in losses), the gradient's norm (AdamW hides a
            # gradient off by a factor: compare this), and per layer and expert the choices routed to
            # it and those it dropped (over capacity).
            metrics["aux_losses"] = [s["aux_loss"] for s in expert_steps]
            metrics["gradient_norms"] = [s["gradient_norm"] for s in expert_steps]
            metrics["expert_load"] = [s["routed"] for s in expert_steps]
            metrics["dropped"] = [s["dropped"] for s in expert_steps]
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        sys.stdout.write(
            f"wrote {args.out / 'metrics.json'} and final.pt; each rank stores "
            f"{metrics['local_parameters']} of {total:,} parameter elements\n"
        )
        if args.mfu:
            sys.stdout.write(describe(figures) + "\n")
    return 0


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


FSDP_NOTED = []


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
