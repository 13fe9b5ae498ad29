"""Train the course's small GPT on addition in one of five layouts: the capstone's reference script.

    python train_gpt.py --parallel single --out work/gpt_single
    torchrun --standalone --nproc_per_node=2 train_gpt.py --parallel ddp --out work/gpt_ddp  # or fsdp, tp
    torchrun --standalone --nproc_per_node=4 train_gpt.py --parallel 2d --sequence-parallel --out work/gpt_2d

Every layout trains the same model on the same global batches, so its per-step losses equal the
single process's up to float rounding. Writes metrics.json (losses, parameters and memory per
rank, the sharding) and final.pt (the whole model, from rank 0) to --out. The model and the task
come from the course's package (parallel_course.gpt), shared with the notebook and the labs.
"""

import argparse
import contextlib
import gc
import json
import logging
import os
import socket
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
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

from parallel_course.gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum

LAYOUTS = ("single", "ddp", "fsdp", "tp", "2d")
TP_SIZE_2D = 2  # tensor-parallel ranks per data-parallel group in the 2d layout


def mesh_shape(layout, world_size):
    """(data-parallel size, tensor-parallel size) of a layout on world_size processes."""
    return {"tp": (1, world_size), "2d": (world_size // TP_SIZE_2D, TP_SIZE_2D)}.get(layout, (world_size, 1))


def parse_args(argv=None):
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
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if min(args.steps, args.global_batch_size) < 1:
        parser.error("--steps and --global-batch-size must be at least 1")
    if not 1 <= args.digits <= 4:  # the sequence must fit the model's 16 positions
        parser.error(f"--digits must be 1 to 4, got {args.digits}")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.parallel == "single" and world_size > 1:
        parser.error(f"--parallel single is one process, but the world size is {world_size}")
    if args.parallel == "2d" and (world_size < 2 * TP_SIZE_2D or world_size % TP_SIZE_2D):
        parser.error(f"--parallel 2d needs an even world size of at least {2 * TP_SIZE_2D}, got {world_size}")
    tp, heads = mesh_shape(args.parallel, world_size)[1], GPTConfig().n_heads
    if heads % tp:  # each tensor-parallel rank computes whole heads
        parser.error(
            f"--parallel {args.parallel} splits the {heads} attention heads over {tp} ranks: "
            f"use a world size that divides {heads}"
        )
    if args.sequence_parallel and args.parallel not in ("tp", "2d"):
        parser.error(f"--sequence-parallel needs --parallel tp or 2d, got {args.parallel}")
    dp = mesh_shape(args.parallel, world_size)[0]
    if args.global_batch_size % dp:
        parser.error(f"--global-batch-size {args.global_batch_size} is not divisible by the {dp} data-parallel ranks")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    return args


def free_port():
    """A port the operating system says is free (plain `python` runs): never a fixed number."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def setup():
    """Backend and device from what is present; works under torchrun and as plain python."""
    for key, value in [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", free_port()),
    ]:
        os.environ.setdefault(key, value)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    # nccl: bind the group to this process's GPU (its communicator is made now, barrier() uses it)
    dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=device if backend == "nccl" else None)
    return device


def local(t):
    """The part of a tensor this rank stores: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors):
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def tensor_parallel(model, tp_mesh, sequence=False):
    """Megatron-style: q, k, v and the MLP's first layer split by columns (output features), the
    projections after them by rows. Per block, forward: an all-reduce after each row-parallel
    projection (2); backward: one for the input gradient of each column-parallel layer (4: q, k, v
    and fc; a fused qkv would make it 2). The head is split by vocabulary, its logits gathered.
    Sequence parallelism also splits the embeddings, and by position what flows between the split
    layers: each all-reduce becomes a reduce-scatter, and an all-gather before the next split layer."""
    seq = Shard(1) if sequence else Replicate()  # the activations between the split layers
    plan = {"head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
    for i in range(len(model.blocks)):
        plan |= {f"blocks.{i}.attn.{name}": ColwiseParallel() for name in ("q", "k", "v")}
        plan |= {
            f"blocks.{i}.attn.proj": RowwiseParallel(output_layouts=seq),
            f"blocks.{i}.mlp.fc": ColwiseParallel(),
            f"blocks.{i}.mlp.proj": RowwiseParallel(output_layouts=seq),
        }
        if sequence:  # norms on this rank's positions; attention and MLP gather the whole sequence
            plan |= {
                f"blocks.{i}.{m}": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
                for m in ("attn", "mlp")
            } | {f"blocks.{i}.{norm}": SequenceParallel() for norm in ("ln1", "ln2")}
    if sequence:  # pos_emb's output is (T, d): its positions are dim 0
        plan |= {
            "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "ln_f": SequenceParallel(),
            "pos_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        }
    parallelize_module(model, tp_mesh, plan)


def apply_layout(model, layout, mesh, device, sequence=False):
    """The layout around the model; returns what to call in the training loop."""
    if layout in ("tp", "2d"):
        tensor_parallel(model, mesh["tp"], sequence)
    if layout in ("fsdp", "2d"):  # after TP: FSDP shards the (TP-local) parameters further over dp
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        # With TP the logits come out of the gather as a view, and FSDP warns in case an in-place
        # op on them followed (it would skip FSDP's backward hook). None does: the loss only reads.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if layout == "ddp":
        return DDP(
            model, device_ids=[device.index] if device.type == "cuda" else None, process_group=mesh.get_group("dp")
        )
    return model


class SavedActivations:
    """Bytes of the tensors autograd keeps for backward (parameters excluded, views of one storage
    once): a CPU has no allocator statistics; on a GPU, torch.cuda.max_memory_allocated has it all."""

    def __init__(self, model):
        self.model, self.storages, self.bytes = model, set(), 0

    def pack(self, t):
        storage = local(t).untyped_storage()
        # The parameters as they are now: FSDP swaps in the whole ones only around a block's forward.
        weights = {local(p).untyped_storage().data_ptr() for p in self.model.parameters()}
        if storage.data_ptr() not in weights | self.storages:  # weights, or views of them, are no activations
            self.storages.add(storage.data_ptr())
            self.bytes += storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def train(args, model, step_fn, mesh, device):
    """The training loop; returns the global mean loss of every step and this rank's memory."""
    task = AdditionTask(args.digits)
    data = torch.Generator().manual_seed(args.seed + 1)  # every rank draws every global batch...
    dp_size, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    per_rank = args.global_batch_size // dp_size  # ...and trains on its data-parallel share
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
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
            global_count = count * dp_size  # every problem has as many answer digits
            # DDP and FSDP average gradients over the dp ranks: scale so that the average is the
            # gradient of the global mean (a mean of each rank's own mean would drift).
            (loss_sum * dp_size / global_count).backward()
        if step == 0:
            memory |= {
                "gradient_bytes": nbytes(p.grad for p in model.parameters() if p.grad is not None),
                "activation_bytes": saved.bytes,
            }
            block = (
                {}
                if comms.__class__ is not CommDebugMode
                else next(counts for name, counts in comms.comm_module_counts.items() if name.endswith("blocks.0"))
            )
            collectives = {phase: {str(op): n for op, n in block[phase].items()} for phase in block}
        optimizer.step()
        optimizer.zero_grad()
        logged = loss_sum.detach().clone()
        dist.all_reduce(logged, group=mesh.get_group("dp"))  # tp ranks hold the same loss: dp only
        losses.append(logged.item() / global_count)
        if dist.get_rank() == 0 and ((step + 1) % log_every == 0 or step == 0):
            sys.stdout.write(f"step {step + 1}/{args.steps}: loss {losses[-1]:.4f}\n")
    memory["optimizer_state_bytes"] = nbytes(
        t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    )
    return losses, memory, collectives


def main(argv=None):
    args = parse_args(argv)
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dp, tp = mesh_shape(args.parallel, world_size)
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(args.seed)  # the same initial weights in every layout, before any sharding
    model = GPT(GPTConfig(), activation_checkpointing=args.activation_checkpointing).to(device)
    names = [name for name, _ in model.named_parameters()]
    total = sum(p.numel() for p in model.parameters())
    step_fn = apply_layout(model, args.parallel, mesh, device, args.sequence_parallel)
    if rank == 0:
        sys.stdout.write(
            f"{args.parallel}: backend={dist.get_backend()} device={device.type} world_size={world_size} "
            f"(dp {dp} x tp {tp}), global batch {args.global_batch_size}\n"
        )
    losses, memory, collectives = train(args, model, step_fn, mesh, device)

    mine = {"local_parameters": sum(local(p).numel() for p in model.parameters()), **memory}
    every = [None] * world_size
    dist.all_gather_object(every, mine)  # each rank's own figures, in rank order
    placements = {n: str(p.placements) if isinstance(p, DTensor) else "whole" for n, p in model.named_parameters()}
    # The whole model for final.pt. Gathering a 2d parameter takes two all-gathers, and DTensor
    # warns so at every one; true, and harmless once at the end.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    full = {n: p.full_tensor() if isinstance(p, DTensor) else p.detach() for n, p in zip(names, model.parameters())}
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


if __name__ == "__main__":
    main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
