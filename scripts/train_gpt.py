"""Train the course's small GPT on addition in one of five layouts: the capstone's reference script.

    python train_gpt.py --parallel single --out work/gpt_single
    torchrun --standalone --nproc_per_node=2 train_gpt.py --parallel ddp --out work/gpt_ddp
    torchrun --standalone --nproc_per_node=4 train_gpt.py --parallel 2d --sequence-parallel --out work/gpt_2d

(`--parallel fsdp` and `tp` run like `ddp`.) Every layout trains the same model on the same global
batches, so its per-step losses equal the single process's up to float rounding. Writes
metrics.json (losses, parameters and memory per rank, the sharding, the collectives of one
tensor-parallel block) and final.pt (the whole model, from rank 0) to --out.

A layout is a few functions applied in order by build_model: apply_tp (with apply_sp for sequence
parallelism), then apply_fsdp or apply_ddp over the data-parallel ranks. The model and the task
come from the course's package (parallel_course.gpt), shared with the notebook and the labs; the
process group from dist_setup.py, which must sit beside this file.
"""

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
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
from parallel_course.gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum

LAYOUTS = ("single", "ddp", "fsdp", "tp", "2d")
# Tensor-parallel ranks per data-parallel group in the 2d layout.
TP_SIZE_2D = 2


def mesh_shape(layout: str, world_size: int) -> tuple[int, int]:
    """(data-parallel size, tensor-parallel size) of a layout on world_size processes."""
    return {"tp": (1, world_size), "2d": (world_size // TP_SIZE_2D, TP_SIZE_2D)}.get(layout, (world_size, 1))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a small GPT on addition: single, DDP, FSDP, TP or FSDP x TP.")
    parser.add_argument("--parallel", choices=LAYOUTS, default="single", help="the layout (default: single)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="fixes the initial weights and the data")
    parser.add_argument("--global-batch-size", type=int, default=64, help="problems per step, all ranks together")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--digits", type=int, default=2, help="digits of each number added (1 to 4)")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    parser.add_argument("--sequence-parallel", action="store_true", help="tp, 2d: split activations by position")
    parser.add_argument("--out", type=Path, required=True, help="folder for metrics.json and final.pt")
    args = parser.parse_args(argv)
    # Checked before the group is joined: a bad request is one line, before anything starts.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if min(args.steps, args.global_batch_size) < 1:
        parser.error("--steps and --global-batch-size must be at least 1")
    # The sequence must fit the model's 16 positions.
    if not 1 <= args.digits <= 4:
        parser.error(f"--digits must be 1 to 4, got {args.digits}")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.parallel == "single" and world_size > 1:
        parser.error(f"--parallel single is one process, but the world size is {world_size}")
    if args.parallel == "2d" and (world_size < 2 * TP_SIZE_2D or world_size % TP_SIZE_2D):
        parser.error(f"--parallel 2d needs an even world size of at least {2 * TP_SIZE_2D}, got {world_size}")
    dp, tp = mesh_shape(args.parallel, world_size)
    heads = GPTConfig().n_heads
    # Each tensor-parallel rank computes whole heads.
    if heads % tp:
        parser.error(
            f"--parallel {args.parallel} splits the {heads} attention heads over {tp} ranks: "
            f"use a world size that divides {heads}"
        )
    if args.sequence_parallel and args.parallel not in ("tp", "2d"):
        parser.error(f"--sequence-parallel needs --parallel tp or 2d, got {args.parallel}")
    if args.global_batch_size % dp:
        parser.error(f"--global-batch-size {args.global_batch_size} is not divisible by the {dp} data-parallel ranks")
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
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    # With TP the logits come out of the gather as a view, and FSDP warns in case an in-place op on
    # them followed (it would skip FSDP's backward hook). None does: the loss only reads them.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def apply_ddp(model: GPT, dp_mesh: DeviceMesh, device: torch.device) -> DDP:
    """Whole copies on the data-parallel ranks, gradients all-reduced in buckets during backward."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, process_group=dp_mesh.get_group())


def build_model(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device) -> tuple[GPT, torch.nn.Module]:
    """The GPT in the chosen layout: the model, and what the training loop calls (DDP's wrapper,
    or the model itself). TP first, then FSDP over dp, which shards the TP-local parameters further."""
    # The same initial weights in every layout: made whole from the seed, before any sharding.
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(), activation_checkpointing=args.activation_checkpointing).to(device)
    if args.parallel in ("tp", "2d"):
        apply_tp(model, mesh["tp"], args.sequence_parallel)
    if args.parallel in ("fsdp", "2d"):
        apply_fsdp(model, mesh["dp"])
    if args.parallel == "ddp":
        return model, apply_ddp(model, mesh["dp"], device)
    return model, model


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


def train(args, model, step_fn, mesh, device):
    """The training loop; returns the global mean loss of every step, this rank's memory and the
    collectives of one block in step 1."""
    task = AdditionTask(args.digits)
    # Every rank draws every global batch, and trains on its data-parallel share of it.
    data = torch.Generator().manual_seed(args.seed + 1)
    dp_size, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    per_rank = args.global_batch_size // dp_size
    # On a GPU, AdamW updates every parameter in one foreach kernel, which cannot mix DTensors with
    # plain tensors: in the tp layout the embeddings and norms stay plain beside the sharded weights.
    mixed = len({isinstance(p, DTensor) for p in model.parameters()}) > 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False if mixed else None)
    losses, memory = [], {"parameter_bytes": nbytes(model.parameters())}
    log_every = max(1, args.steps // 10)
    # The module hooks that count collectives (step 1, below) warn that the token ids need no gradient.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
    for step in range(args.steps):
        x, y = task.batch(data, args.global_batch_size)
        x, y = (t[dp_rank * per_rank : (dp_rank + 1) * per_rank].to(device) for t in (x, y))
        saved = SavedActivations(model)
        # Step 1 of a tensor-parallel layout also counts the collectives of every module.
        comms = CommDebugMode() if step == 0 and mesh["tp"].size() > 1 else contextlib.nullcontext()
        with comms:
            with saved.hooks():
                loss_sum, count = answer_loss_sum(step_fn(x), y)
            # Every problem has as many answer digits.
            global_count = count * dp_size
            # DDP and FSDP average gradients over the dp ranks: scale so that the average is the
            # gradient of the global mean (a mean of each rank's own mean would drift).
            (loss_sum * dp_size / global_count).backward()
        if step == 0:
            memory["gradient_bytes"] = nbytes(p.grad for p in model.parameters() if p.grad is not None)
            memory["activation_bytes"] = saved.bytes
            collectives = block_collectives(comms)
        optimizer.step()
        optimizer.zero_grad()
        logged = loss_sum.detach().clone()
        # The tp ranks of a group hold the same loss: summed over dp only.
        dist.all_reduce(logged, group=mesh.get_group("dp"))
        losses.append(logged.item() / global_count)
        if dist.get_rank() == 0 and ((step + 1) % log_every == 0 or step == 0):
            sys.stdout.write(f"step {step + 1}/{args.steps}: loss {losses[-1]:.4f}\n")
    memory["optimizer_state_bytes"] = nbytes(
        t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    )
    return losses, memory, collectives


def whole_model(model: GPT) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered from its shards), on every rank: a collective."""
    # Gathering a 2d parameter takes two all-gathers, and DTensor warns so at every one; true, and
    # harmless once at the end.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    return {n: p.full_tensor() if isinstance(p, DTensor) else p.detach() for n, p in model.named_parameters()}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dp, tp = mesh_shape(args.parallel, world_size)
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model, step_fn = build_model(args, mesh, device)
    # A DTensor's numel() is the whole parameter's.
    total = sum(p.numel() for p in model.parameters())
    if rank == 0:
        sys.stdout.write(
            f"{args.parallel}: backend={dist.get_backend()} device={device.type} world_size={world_size} "
            f"(dp {dp} x tp {tp}), global batch {args.global_batch_size}\n"
        )
    losses, memory, collectives = train(args, model, step_fn, mesh, device)

    mine = {"local_parameters": sum(local(p).numel() for p in model.parameters()), **memory}
    # Each rank's own figures, in rank order.
    every = [None] * world_size
    dist.all_gather_object(every, mine)
    placements = {n: str(p.placements) if isinstance(p, DTensor) else "whole" for n, p in model.named_parameters()}
    full = whole_model(model)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save({n: t.cpu() for n, t in full.items()}, args.out / "final.pt")
        metrics = {
            "parallel": args.parallel,
            "world_size": world_size,
            "mesh": {"dp": dp, "tp": tp},
            "steps": args.steps,
            "seed": args.seed,
            "global_batch_size": args.global_batch_size,
            "activation_checkpointing": args.activation_checkpointing,
            "losses": losses,
            "total_parameters": total,
            "local_parameters": [m.pop("local_parameters") for m in every],
            "memory": every,
            "placements": placements,
            "sequence_parallel": args.sequence_parallel,
            "collectives_per_block": collectives,
        }
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        sys.stdout.write(
            f"wrote {args.out / 'metrics.json'} and final.pt; each rank stores "
            f"{metrics['local_parameters']} of {total:,} parameter elements\n"
        )
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
