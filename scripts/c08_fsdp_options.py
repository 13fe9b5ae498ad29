"""FSDP2 beyond sharding: a mixed precision policy, a sharded checkpoint, CPU offload.

    torchrun --standalone --nproc_per_node=2 c08_fsdp_options.py [--out DIR]

Uses the model and helpers of c08_zero1_optimizer.py (keep the two files side by side). Writes the
sharded checkpoint to DIR/c08_checkpoint/ and, from rank 0, the full weights to
DIR/c08_full_weights.pt (default DIR: work).
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

# The chapter's model and helpers, from c08_zero1_optimizer.py beside this file.
from c08_zero1_optimizer import make_model, per_rank, print0, train
from dist_setup import setup, teardown


def shard(model, mesh, **options):
    """fully_shard each block, then the root, with the same options."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def make_batches(n, device):
    """`n` batches of this rank's share of the data."""
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    return [(torch.randn(8, 32, generator=g).to(device), torch.randn(8, 5, generator=g).to(device)) for _ in range(n)]


def mixed_precision(mesh, batches, device, fp32_losses):
    """Train with 16-bit compute and fp32 shards; True if the losses stay within 16-bit rounding of
    `fp32_losses` (the same training in float32)."""
    # bfloat16 needs a GPU from NVIDIA's Ampere on (A100, RTX 30xx): older ones compute in float16.
    bf16 = device.type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)
    low = torch.bfloat16 if bf16 else torch.float16
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    model = shard(make_model(device), mesh, mp_policy=policy)
    # The dtypes that the first block's linear layer sees inside forward.
    seen = {}

    def record_dtypes(module, inputs, output):
        seen.update(weight=module.weight.dtype, input=inputs[0].dtype, output=output.dtype)

    model.blocks[0][0].register_forward_hook(record_dtypes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = train(model, optimizer, batches)

    p = model.blocks[0][0].weight
    print0(f"1. MixedPrecisionPolicy(param_dtype={str(low).removeprefix('torch.')}, reduce_dtype=float32)")
    print0(f"   inside forward: weight {seen['weight']}, input {seen['input']}, output {seen['output']}")
    print0(
        f"   stored between steps: sharded weight {p.dtype}, its gradient {p.grad.dtype}, "
        f"Adam's exp_avg {optimizer.state[p]['exp_avg'].dtype}"
    )
    # bfloat16 keeps 8 significant bits (float16 11): each operation rounds at 2**-8 of its value,
    # and so, about, does the loss. (The weights would prove nothing: five Adam steps at lr 1e-3
    # move none by much more than 5e-3, whatever the arithmetic.)
    rtol = 2**-8
    diff = max(per_rank(((losses - fp32_losses) / fp32_losses).abs().max().item()))
    print0(
        f"   losses of {len(batches)} steps, 16-bit compute vs fp32 (every rank): "
        f"{'PASS' if diff <= rtol else 'FAIL'} max relative difference <= 2**-8 (equal: {diff == 0})"
    )
    return diff <= rtol


def same_shards(a, b):
    """True on every rank if the two sharded models hold equal local shards everywhere."""
    return all(per_rank(all(torch.equal(p.to_local(), q.to_local()) for p, q in zip(a.parameters(), b.parameters()))))


def checkpoint_round_trip(model, optimizer, mesh, next_batch, out, device):
    """Save model and optimizer with DCP, load them into a fresh sharded model, and check that both
    hold the same weights, and still do after one more step; the full weights go to a file too."""
    checkpoint = Path(out) / "c08_checkpoint"
    if dist.get_rank() == 0:
        shutil.rmtree(checkpoint, ignore_errors=True)
    dist.barrier()
    # Sharded: each rank saves its part.
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint)
    dist.barrier()
    print0(f"2. dcp.save wrote {checkpoint.name}/: {', '.join(sorted(os.listdir(checkpoint)))}")
    # full_state_dict: all-gathered (a collective on every rank); cpu_offload: only rank 0 keeps it.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(full, Path(out) / "c08_full_weights.pt")

    # Different weights to start from: the load must overwrite them.
    torch.manual_seed(1234)
    fresh = make_model(device).apply(lambda m: [torch.nn.init.normal_(q) for q in m.parameters(recurse=False)])
    restored = shard(fresh, mesh)
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=1e-3)
    model_state, optim_state = get_state_dict(restored, restored_optimizer)
    state = {"model": model_state, "optim": optim_state}
    # Reads into the tensors of `state`, in place.
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(restored, restored_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same_weights = same_shards(restored, model)
    # One more step, from both: equal only if Adam's state was restored too.
    train(restored, restored_optimizer, next_batch)
    train(model, optimizer, next_batch)
    same_after_step = same_shards(restored, model)
    print0(
        f"   dcp.load into a fresh sharded model: weights equal: {same_weights}; "
        f"equal after one more step (Adam state restored too): {same_after_step}"
    )
    return same_weights and same_after_step


def cpu_offload(mesh, batch, device):
    """Keep the shards in host memory, moved to the device when needed; prints where they live,
    or the error where offloading cannot run."""
    try:
        model = shard(make_model(device), mesh, offload_policy=CPUOffloadPolicy())
        train(model, torch.optim.Adam(model.parameters(), lr=1e-3), batch)
        where = model.blocks[0][0].weight.to_local().device
        print0(f"3. CPUOffloadPolicy: sharded weights live on {where.type}, compute on {device.type}")
    except RuntimeError as error:
        print0(f"3. CPUOffloadPolicy on this machine: {type(error).__name__}: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="work", help="folder for the checkpoint (default: work)")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    args = parser.parse_args()
    device = setup()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    batches = make_batches(args.steps + 1, device)
    model = shard(make_model(device), mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    fp32_losses = train(model, optimizer, batches[: args.steps])

    mixed_ok = mixed_precision(mesh, batches[: args.steps], device, fp32_losses)
    checkpoint_ok = checkpoint_round_trip(model, optimizer, mesh, batches[args.steps :], args.out, device)
    cpu_offload(mesh, batches[:1], device)
    return 0 if mixed_ok and checkpoint_ok else 1


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
