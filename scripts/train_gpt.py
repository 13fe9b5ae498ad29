"""Train the course's small GPT on addition in one of ten layouts: the capstone's reference script.

    python train_gpt.py --parallel single --out work/gpt_single
    torchrun --standalone --nproc_per_node=2 train_gpt.py --parallel ddp --out work/gpt_ddp
    torchrun --standalone --nproc_per_node=4 train_gpt.py --parallel 2d --sequence-parallel --out work/gpt_2d
    torchrun --standalone --nproc_per_node=4 train_gpt.py --parallel dp_pp --grad-accum 4 --out work/gpt_dp_pp
    torchrun --standalone --nproc_per_node=2 train_gpt.py --parallel ep --moe-experts 4 --out work/gpt_ep

Every layout trains the same model on the same global batches, so its per-step losses equal the
single process's up to float rounding, also with problems of mixed lengths (`--variable-length`)
and gradients accumulated over micro-batches (`--grad-accum K`): so are the norms of the whole
model's gradient, which it computes every step in every layout, every parameter counted once
(parallel_course.training.gradient_norm). `--clip-grad-norm C` clips by that norm, the same factor
on every rank, and a step whose norm is not finite is skipped by every rank alike (`--slip` and
`--inject-nonfinite-step` make a known mistake or a fault on purpose: the course's negative
controls). Writes metrics.json (losses, gradient norms, parameters and memory per rank, the
sharding, the collectives of one tensor-parallel block, the throughput: tokens/s and model FLOP/s)
and final.pt (the whole model, from rank 0) to --out. With `--mfu` every process also measures its
matrix-product peak, and the last line gives the model FLOPs utilisation against their sum.
In the dense layouts (single, ddp, fsdp, tp, 2d), `--dtype bfloat16` runs the forward under
autocast, `--float8` makes the blocks' linears torchao's FP8 ones (chapter 17a) and `--compile`
compiles every block (chapter 17b); metrics.json records what each did (parallel_course.training.precision).

With `--checkpoint-dir`, it saves a checkpoint every `--checkpoint-every` steps, and when the job
is preempted (SIGTERM or SIGUSR1); `--resume` continues from one in any layout and world size.
`--steps 0 --checkpoint-dir DIR` writes the initial weights only: a seed checkpoint, from which
a run starts without any rank ever holding the whole model.

This file is the trainer: its arguments, the model built in a layout, the training loop, what it
writes. The layouts themselves are the course package's (parallel_course.training): the table of
layouts (`--help` prints it), one function per parallelism applied in the table's order, expert
parallelism, checkpoints and what a step measures. The model and the task come from
parallel_course.gpt, shared with the notebooks and the labs; the process group from dist_setup.py,
which must sit beside this file.
"""

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from dist_setup import setup, teardown
from parallel_course.gpt import GPT, IGNORE, AdditionTask, GPTConfig, answer_loss_sum
from parallel_course.throughput import describe
from parallel_course.training.checkpointing import Checkpoints, checkpoint_step, latest_checkpoint, load_checkpoint
from parallel_course.training.experts import ExpertLoad
from parallel_course.training.gradient_norm import SLIPS, clip_gradients, gradient_norm, inject_nonfinite
from parallel_course.training.layouts import LAYOUTS, help_table, layouts_that
from parallel_course.training.parallelize import (
    gradient_sync,
    parallelize,
    pipeline_schedule,
    sequence_share,
    whole_model,
    wrap,
)
from parallel_course.training.precision import DTYPES, Precision
from parallel_course.training.step_metrics import (
    SavedActivations,
    StepClock,
    block_collectives,
    held_gradient_bytes,
    local,
    nbytes,
    optimizer_state_bytes,
    throughput,
)

# --slip: the mistakes made in the gradient itself (gradient_norm.SLIPS computes its norm wrong), and
# for every slip the mesh dimension that must be above 1 for it to make a difference.
GRADIENT_SLIPS = ("no-dp-factor", "scale-grads")
SLIP_NEEDS = {
    "no-dp-factor": "batch",
    "scale-grads": "pp",
    "local-norm": "world",
    "replicas-counted": "world",
    "stages-unreduced": "pp",
    "experts-every-rank": "expert_dp",
    "norms-added": "pp",
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a small GPT on addition, in one of the layouts below.",
        epilog=help_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    parser.add_argument(
        "--clip-grad-norm",
        type=float,
        default=None,
        metavar="C",
        help="scale the gradients so that the whole model's gradient norm is at most C (default: no clipping)",
    )
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the forward's: bfloat16 under autocast, the weights and AdamW's state float32 (default float32)",
    )
    parser.add_argument(
        "--float8", action="store_true", help="the blocks' linears torchao's FP8 ones (emulated without FP8 GPUs)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile every block (after TP and FSDP)")
    parser.add_argument(
        "--compile-backend", choices=("eager", "aot_eager", "inductor"), help="--compile's (default aot_eager)"
    )
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
    controls = parser.add_argument_group("negative controls (a mistake or a fault on purpose: a check must catch it)")
    controls.add_argument(
        "--slip",
        choices=[*GRADIENT_SLIPS, *SLIPS],
        metavar="NAME",
        help="a known mistake. The gradient off by a factor: no-dp-factor (the loss scale without the dp or cp "
        "size), scale-grads (the pipeline's schedule divides by the micro-batches once more). Its norm computed "
        "wrong: local-norm (a rank's own pieces), replicas-counted (copies counted on every rank), stages-unreduced, "
        "experts-every-rank (experts counted on every replica), norms-added (the stages' norms added, not their "
        "squares)",
    )
    controls.add_argument(
        "--inject-nonfinite-step",
        type=int,
        default=None,
        metavar="K",
        help="in step K, the last rank's first gradient element becomes NaN: every rank must skip that step",
    )
    args = parser.parse_args(argv)
    # Checked before the group is joined: a bad request is one line, before anything starts.
    problem = check(args, int(os.environ.get("WORLD_SIZE", "1")))
    if problem is not None:
        parser.error(problem)
    return args


def check(args: argparse.Namespace, world_size: int) -> str | None:
    """The first thing wrong with the request on world_size processes, or None; fills in the defaults
    that depend on the layout (--grad-accum) and the step a --resume starts from."""
    layout = LAYOUTS[args.parallel]
    if args.steps < 0 or args.global_batch_size < 1:
        return "--steps must be at least 0 and --global-batch-size at least 1"
    if args.steps == 0 and args.checkpoint_dir is None:
        return "--steps 0 trains nothing: add --checkpoint-dir to write a seed checkpoint (the initial weights)"
    # The sequence must fit the model's 16 positions.
    if not 1 <= args.digits <= 4:
        return f"--digits must be 1 to 4, got {args.digits}"
    if not args.lr > 0:
        return f"--lr must be positive, got {args.lr}"
    if args.clip_grad_norm is not None and not args.clip_grad_norm > 0:
        return f"--clip-grad-norm must be positive, got {args.clip_grad_norm}"
    if args.inject_nonfinite_step is not None and not 1 <= args.inject_nonfinite_step <= args.steps:
        return f"--inject-nonfinite-step must be a step from 1 to --steps {args.steps}"
    if layout.refusal(world_size):
        return layout.refusal(world_size)
    dims, experts = layout.dims(world_size), layout.expert_dims(world_size)
    seq_len, heads = AdditionTask(args.digits).seq_len, GPTConfig().n_heads
    if dims.get("cp", 1) > 1 and seq_len % (2 * dims["cp"]):
        return (
            f"--parallel {args.parallel} cuts each sequence into {2 * dims['cp']} equal zig-zag chunks: "
            f"--digits {args.digits} gives {seq_len} tokens (--digits 2 gives 8)"
        )
    if args.moe_experts < 0:
        return f"--moe-experts must be at least 0 (0: the dense MLP), got {args.moe_experts}"
    if args.moe_experts and not layout.takes_experts:
        return f"--moe-experts runs with --parallel {layouts_that('takes_experts')}, got {args.parallel}"
    if args.moe_experts and not 1 <= args.top_k <= args.moe_experts:
        return f"--top-k must be 1 to the {args.moe_experts} experts, got {args.top_k}"
    if not args.capacity_factor > 0 or not args.aux_loss_weight >= 0:
        return "--capacity-factor must be above 0 and --aux-loss-weight at least 0"
    if experts is not None and not args.moe_experts:
        return f"--parallel {args.parallel} spreads experts over the ranks: add --moe-experts E"
    if experts is not None and args.moe_experts % experts["ep"]:
        return f"--parallel {args.parallel}: the {args.moe_experts} experts do not divide over {experts['ep']} ranks"
    if experts is not None and (args.checkpoint_dir or args.resume):
        return f"--parallel {args.parallel} saves no checkpoints yet: drop --checkpoint-dir and --resume"
    # Each tensor-parallel rank computes whole heads.
    if heads % dims["tp"]:
        return (
            f"--parallel {args.parallel} splits the {heads} attention heads over {dims['tp']} ranks: "
            f"use a world size that divides {heads}"
        )
    if Precision.refusal(args, layout):
        return Precision.refusal(args, layout)
    args.precision = Precision.of(args)
    if args.sequence_parallel and not layout.tensor_parallel:
        return f"--sequence-parallel needs --parallel {layouts_that('tensor_parallel')}, got {args.parallel}"
    pp = dims["pp"]
    if args.grad_accum is None:
        args.grad_accum = 2 * pp if pp > 1 else 1
    if args.grad_accum < 1:
        return f"--grad-accum must be at least 1, got {args.grad_accum}"
    # Schedule1F1B refuses fewer micro-batches than stages.
    if pp > 1 and args.grad_accum < pp:
        return f"--parallel {args.parallel}: the pipeline's {pp} stages need --grad-accum {pp} or more"
    if args.global_batch_size % (dims["dp"] * args.grad_accum):
        return (
            f"--global-batch-size {args.global_batch_size} is not divisible by the {dims['dp']} data-parallel ranks "
            f"x {args.grad_accum} micro-batches"
        )
    if args.slip is not None:
        need = SLIP_NEEDS[args.slip]
        sizes = {"batch": dims["dp"] * dims.get("cp", 1), "world": world_size, **dims, **(experts or {})}
        if sizes.get(need, 1) == 1:
            return f"--slip {args.slip} changes nothing in --parallel {args.parallel} on {world_size}: no {need} ranks"
    if args.sync_every_micro_batch and not layout.defers_gradient_sync:
        return f"--sync-every-micro-batch needs --parallel {layouts_that('defers_gradient_sync')}, got {args.parallel}"
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        return f"--checkpoint-every must be at least 1, got {args.checkpoint_every}"
    if (args.checkpoint_every or args.async_checkpoint) and args.checkpoint_dir is None:
        return "--checkpoint-every and --async-checkpoint need --checkpoint-dir"
    if args.checkpoint_dir is not None and args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        return f"--checkpoint-dir {args.checkpoint_dir} exists and is not a folder"
    args.start_step = 0
    if args.resume is not None:
        found = latest_checkpoint(args.resume)
        if found is None:
            return f"--resume {args.resume}: no checkpoint there (no step-NNNNNN folder with a .metadata file)"
        args.resume, args.start_step = found, checkpoint_step(found)
        if args.start_step >= args.steps:
            return f"--resume {found} is at step {args.start_step}: nothing left of --steps {args.steps}"
    if args.resume_weights_only and args.resume is None:
        return "--resume-weights-only needs --resume"
    if args.out.exists() and not args.out.is_dir():
        return f"--out {args.out} exists and is not a folder"
    return None


def build_model(args: argparse.Namespace, meshes, device: torch.device):
    """The GPT in the chosen layout, and what the training calls (DDP's wrapper, or the model):
    the layout's functions applied in the table's order (pipeline stage, then TP, then FSDP over
    dp, which shards the TP-local parameters further; see LAYOUTS), then its wrapper.

    Made whole from the seed, before any sharding: the same initial weights in every layout. With
    --resume it is built on the meta device instead (shapes, no storage), laid out, and only then
    given memory on this device, for the checkpoint to fill in: no rank ever holds the whole model.
    """
    torch.manual_seed(args.seed)
    with torch.device("meta") if args.resume else contextlib.nullcontext():
        cfg = GPTConfig(moe_experts=args.moe_experts, top_k=args.top_k, capacity_factor=args.capacity_factor)
        model = GPT(cfg, activation_checkpointing=args.activation_checkpointing)
    if args.resume is None:
        model.to(device)
    # --float8 before the layout: tensor parallelism splits the FP8 linears, FSDP gathers them in 8 bits.
    args.precision.convert(model, meshes, device)
    parallelize(model, meshes, args.sequence_parallel)
    if args.resume:
        model.to_empty(device=device)
    # --compile once TP and FSDP have put their collectives in the blocks, before DDP wraps the model.
    args.precision.compile(model)
    return model, wrap(model, meshes)


def make_optimizer(model, args) -> torch.optim.AdamW:
    """AdamW over every parameter of this rank, at --lr; with FP8 all-gathers, the weights' scales
    computed again after each of its steps (Precision.keep_scales)."""
    # On a GPU, AdamW updates every parameter in one foreach kernel, which cannot mix DTensors with
    # plain tensors: in the tp layout the embeddings and norms stay plain beside the sharded weights.
    mixed = len({isinstance(p, DTensor) for p in model.parameters()}) > 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False if mixed else None)
    args.precision.keep_scales(optimizer, model)
    return optimizer


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
            # --dtype bfloat16: the forward and the loss under autocast; backward follows their dtypes.
            with args.precision.autocast(x.device.type):
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


def optimizer_step(args, model, meshes, optimizer, step: int) -> float | None:
    """The step's update, once every gradient is reduced: the whole gradient's norm (the same on
    every rank), clipping by it (--clip-grad-norm), AdamW's step; with a norm that is not finite, no
    rank steps. Returns the norm before clipping, or None where it is not finite."""
    if args.inject_nonfinite_step == step and dist.get_rank() == dist.get_world_size() - 1:
        inject_nonfinite(model)
    norm = SLIPS.get(args.slip, gradient_norm)(model, meshes)
    finite = bool(norm.isfinite())
    if finite:
        if args.clip_grad_norm is not None:
            clip_gradients(model, args.clip_grad_norm, norm)
        optimizer.step()
    elif dist.get_rank() == 0:
        sys.stdout.write(f"step {step}/{args.steps}: gradient norm {norm.item()}: step skipped\n")
    optimizer.zero_grad()
    return norm.item() if finite else None


def train(args, model, wrapper, meshes, device) -> dict | None:
    """The training loop from --resume's step (or 0) to --steps; returns each step's global mean loss,
    gradient norm, expert load (--moe-experts) and time, this rank's memory, the collectives of one
    block in its first step, what checkpointing cost; None if preempted."""
    task = AdditionTask(args.digits, args.variable_length)
    # Every rank draws every global batch, and trains on its data-parallel share of it.
    data = torch.Generator().manual_seed(args.seed + 1)
    dp_rank, per_rank = meshes["dp"].get_local_rank(), args.global_batch_size // meshes.size("dp")
    optimizer = make_optimizer(model, args)
    clock = StepClock(optimizer, device)
    if args.resume:
        weights_only = args.resume_weights_only or args.start_step == 0
        load_checkpoint(args.resume, model, optimizer, data, weights_only)
    pipelined, loss_scale = meshes.size("pp") > 1, {}
    if pipelined:
        schedule = pipeline_schedule(model, meshes, device, args.grad_accum, loss_scale, args.slip == "scale-grads")
    checkpoints = Checkpoints(args.checkpoint_dir, args.checkpoint_every, args.steps, args.async_checkpoint, device)
    losses, norms, memory, collectives, expert_steps = [], [], {"parameter_bytes": nbytes(model.parameters())}, {}, []
    log_every = max(1, args.steps // 10)
    # The module hooks that count collectives (step 1, below) warn that the token ids need no gradient.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
    batch_group = meshes.batch.get_group()
    for step in range(args.start_step, args.steps):
        x, y = task.batch(data, args.global_batch_size)
        x, y = (t[dp_rank * per_rank : (dp_rank + 1) * per_rank].to(device) for t in (x, y))
        x, y, positions = sequence_share(x, y, meshes)
        # The loss is the mean over every answer token of the global batch: counted before any
        # backward (it varies with --variable-length), and each micro-batch's summed loss scaled by
        # it. DDP and FSDP average gradients over the ranks sharing the batch (dp, or cp), hence their number.
        global_count = (y != IGNORE).sum()
        dist.all_reduce(global_count, group=batch_group)
        scale = meshes.batch.size() / global_count.item()
        # A negative control: one process's scale, which DDP's average makes N times too small.
        scale /= meshes.batch.size() if args.slip == "no-dp-factor" else 1
        saved, first = SavedActivations(model), step == args.start_step
        load = ExpertLoad(model, args.aux_loss_weight, args.grad_accum, batch_group) if args.moe_experts else None
        # The first step of a tensor-parallel layout also counts the collectives of every module; not
        # with --compile: under CommDebugMode torch.compile runs the blocks eagerly, then never compiles them.
        comms = CommDebugMode() if first and meshes.size("tp") > 1 and not args.compile else contextlib.nullcontext()
        # Counted in the first step only: the hook looks at every saved tensor, and costs time.
        with saved.hooks() if first else contextlib.nullcontext():
            if pipelined:
                first_stage = meshes["pp"].get_local_rank() == 0
                loss_sum, held = pipeline_forward_backward(schedule, first_stage, x, y, scale, loss_scale), 0
            else:
                loss_sum, held = forward_backward(args, model, wrapper, x, y, scale, comms, positions, load)
        if first:
            memory["gradient_bytes"] = nbytes(p.grad for p in model.parameters() if p.grad is not None)
            memory["gradient_bytes_between_micro_batches"] = held
            memory["activation_bytes"] = saved.bytes
            collectives = block_collectives(comms)
        # A mixture of experts: ep's gradients reduced by hand, the step's load and auxiliary loss noted.
        expert_steps += [load.step(meshes.experts)] if load is not None else []
        norms.append(optimizer_step(args, model, meshes, optimizer, step + 1))
        if pipelined:
            # Only the last stage computed the loss: every rank reports it.
            dist.broadcast(loss_sum, group=meshes["pp"].get_group(), group_src=meshes.size("pp") - 1)
        # The tp ranks of a group hold the same loss: summed over dp (or cp) only.
        dist.all_reduce(loss_sum, group=batch_group)
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
    memory["optimizer_state_bytes"] = optimizer_state_bytes(optimizer)
    run = {"losses": losses, "gradient_norms": norms, "memory": memory, "collectives_per_block": collectives}
    return {**run, "expert_steps": expert_steps, "checkpoints": checkpoints.saves, "step_times_s": clock.step_times_s}


def prepare(args, device: torch.device):
    """The layout's meshes on this process group, the model in it and what the training calls."""
    meshes = LAYOUTS[args.parallel].meshes(device.type, dist.get_world_size())
    model, wrapper = build_model(args, meshes, device)
    return meshes, model, wrapper


def announce(args, meshes, model, device) -> int:
    """Rank 0's first lines: the layout, the mesh, the batch. Returns the model's parameter count (a collective)."""
    # A DTensor's numel() is the whole parameter's; a pipeline stage holds only its own.
    count = torch.tensor(sum(p.numel() for p in model.parameters()), device=device)
    dist.all_reduce(count, group=meshes["pp"].get_group())
    if dist.get_rank() == 0:
        dp, pp, tp, cp = (meshes.size(d) for d in ("dp", "pp", "tp", "cp"))
        start = f", resumed from {args.resume} (step {args.start_step})" if args.resume else ""
        cp_factor = f" x cp {cp}" if cp > 1 else ""
        sys.stdout.write(
            f"{args.parallel}: backend={dist.get_backend()} device={device.type} world_size={dist.get_world_size()} "
            f"(dp {dp} x pp {pp} x tp {tp}{cp_factor}), global batch {args.global_batch_size} in {args.grad_accum} "
            f"micro-batch{'es' if args.grad_accum > 1 else ''}{start}\n"
        )
        if args.moe_experts:
            experts = meshes.layout.expert_dims(dist.get_world_size())
            spread = f", spread over ep {experts['ep']} x expert dp {experts['expert_dp']}" if experts else ""
            sys.stdout.write(
                f"mixture of {args.moe_experts} experts, top-{args.top_k}, capacity factor {args.capacity_factor}"
                f"{spread}\n"
            )
    return int(count)


def write_results(args, meshes, model, trained: dict, total: int, device: torch.device) -> None:
    """Every rank's figures gathered, the whole model gathered; rank 0 writes metrics.json and final.pt."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    task = AdditionTask(args.digits, args.variable_length)
    figures = throughput(model.cfg, task, args.global_batch_size, trained["step_times_s"], device, args.mfu)
    mine = {"local_parameters": sum(local(p).numel() for p in model.parameters()), **trained["memory"]}
    # Each rank's own figures, in rank order.
    every = [None] * world_size
    dist.all_gather_object(every, mine)
    placements = {n: str(p.placements) if isinstance(p, DTensor) else "whole" for n, p in model.named_parameters()}
    full = whole_model(model, meshes)
    if meshes.experts is not None:
        # The experts are spread over the ep ranks: counted whole.
        total = sum(t.numel() for t in full.values())
    if rank != 0:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(full, args.out / "final.pt")
    metrics = {
        "parallel": args.parallel,
        "world_size": world_size,
        "mesh": meshes.dims,
        "steps": args.steps,
        "start_step": args.start_step,
        "seed": args.seed,
        "global_batch_size": args.global_batch_size,
        "grad_accum": args.grad_accum,
        "variable_length": args.variable_length,
        "activation_checkpointing": args.activation_checkpointing,
        # --dtype, and what --compile and --float8 did (each null without its flag).
        **args.precision.record(),
        "losses": trained["losses"],
        # The whole gradient's norm before clipping, each step (None: not finite, the step skipped).
        "gradient_norms": trained["gradient_norms"],
        "clip_grad_norm": args.clip_grad_norm,
        "slip": args.slip,
        "total_parameters": total,
        "local_parameters": [m.pop("local_parameters") for m in every],
        "memory": every,
        "placements": placements,
        "sequence_parallel": args.sequence_parallel,
        "collectives_per_block": trained["collectives_per_block"],
        "checkpoints": trained["checkpoints"],
        "throughput": figures,
    }
    if args.moe_experts:
        metrics["moe"] = {
            "experts": args.moe_experts,
            "top_k": args.top_k,
            "capacity_factor": args.capacity_factor,
            "aux_loss_weight": args.aux_loss_weight,
            "expert_mesh": meshes.layout.expert_dims(world_size),
        }
        # Per step: the load-balancing loss (not in losses), and per layer and expert the choices
        # routed to it and those it dropped (over capacity).
        steps = trained["expert_steps"]
        metrics["aux_losses"] = [s["aux_loss"] for s in steps]
        metrics["expert_load"] = [s["routed"] for s in steps]
        metrics["dropped"] = [s["dropped"] for s in steps]
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    sys.stdout.write(
        f"wrote {args.out / 'metrics.json'} and final.pt; each rank stores "
        f"{metrics['local_parameters']} of {total:,} parameter elements\n"
    )
    if args.mfu:
        sys.stdout.write(describe(figures) + "\n")


def run(args: argparse.Namespace, device: torch.device) -> int:
    """One training in the process group this process has joined (main's, or one of several in a
    launch: train_gpt_runs.py). Returns the exit code."""
    meshes, model, wrapper = prepare(args, device)
    total = announce(args, meshes, model, device)
    trained = train(args, model, wrapper, meshes, device)
    if trained is None:
        # Preempted: the checkpoint is the result.
        return 0
    if args.steps == 0:
        if dist.get_rank() == 0:
            sys.stdout.write(f"seed checkpoint: the initial weights in {args.checkpoint_dir / 'step-000000'}\n")
        return 0
    write_results(args, meshes, model, trained, total, device)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    device = setup()
    return run(args, device)


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
