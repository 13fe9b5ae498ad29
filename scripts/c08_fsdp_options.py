"""FSDP2 beyond sharding: a mixed precision policy, a sharded checkpoint, CPU offload.

    torchrun --standalone --nproc_per_node=2 c08_fsdp_options.py [--out DIR]

Uses the model and helpers of c08_zero1_optimizer.py (keep the two files side by side). Writes the
sharded checkpoint to DIR/c08_checkpoint/ and, from rank 0, the full weights to
DIR/c08_full_weights.pt (default DIR: work).
"""

import argparse
import gc
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

from c08_zero1_optimizer import make_model, per_rank, print0, setup, train  # c08_zero1_optimizer.py: beside this file


def shard(model, mesh, **options):
    """fully_shard each block, then the root, with the same options."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="work", help="folder for the checkpoint (default: work)")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    args = parser.parse_args()
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world_size,))
    g = torch.Generator().manual_seed(1 + rank)  # this rank's share of the data
    batches = [
        (torch.randn(8, 32, generator=g).to(device), torch.randn(8, 5, generator=g).to(device))
        for _ in range(args.steps + 1)
    ]

    # --- 1. Mixed precision: compute in 16 bits, keep and update fp32 shards ---
    # bfloat16 needs a GPU from NVIDIA's Ampere on (A100, RTX 30xx): older ones compute in float16.
    bf16 = device.type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)
    low = torch.bfloat16 if bf16 else torch.float16
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    mp_model = shard(make_model(device), mesh, mp_policy=policy)
    seen = {}
    mp_model.blocks[0][0].register_forward_hook(
        lambda module, inputs, output: seen.update(
            weight=module.weight.dtype, input=inputs[0].dtype, output=output.dtype
        )
    )
    mp_optimizer = torch.optim.Adam(mp_model.parameters(), lr=1e-3)
    mp_losses = train(mp_model, mp_optimizer, batches[: args.steps])
    fp32_model = shard(make_model(device), mesh)
    optimizer = torch.optim.Adam(fp32_model.parameters(), lr=1e-3)
    fp32_losses = train(fp32_model, optimizer, batches[: args.steps])

    p = mp_model.blocks[0][0].weight
    print0(f"1. MixedPrecisionPolicy(param_dtype={str(low).removeprefix('torch.')}, reduce_dtype=float32)")
    print0(f"   inside forward: weight {seen['weight']}, input {seen['input']}, output {seen['output']}")
    print0(
        f"   stored between steps: sharded weight {p.dtype}, its gradient {p.grad.dtype}, "
        f"Adam's exp_avg {mp_optimizer.state[p]['exp_avg'].dtype}"
    )
    # bfloat16 keeps 8 significant bits (float16 11): each operation rounds at 2**-8 of its value, and
    # so, about, does the loss. (The weights would prove nothing: five Adam steps at lr 1e-3 move none by
    # much more than 5e-3, whatever the arithmetic.)
    rtol = 2**-8
    diff = max(per_rank(((mp_losses - fp32_losses) / fp32_losses).abs().max().item()))
    print0(
        f"   losses of {args.steps} steps, 16-bit compute vs fp32 (every rank): "
        f"{'PASS' if diff <= rtol else 'FAIL'} max relative difference <= 2**-8 (equal: {diff == 0})"
    )

    # --- 2. A sharded checkpoint with torch.distributed.checkpoint (DCP) ---
    checkpoint = Path(args.out) / "c08_checkpoint"
    if rank == 0:
        shutil.rmtree(checkpoint, ignore_errors=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(fp32_model, optimizer)  # sharded: each rank its part
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint)
    dist.barrier()
    print0(f"2. dcp.save wrote {checkpoint.name}/: {', '.join(sorted(os.listdir(checkpoint)))}")
    full = get_model_state_dict(fp32_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:  # full_state_dict: all-gathered (a collective); cpu_offload: only rank 0 keeps it
        torch.save(full, Path(args.out) / "c08_full_weights.pt")

    torch.manual_seed(1234)
    restored = shard(
        make_model(device).apply(  # different weights: the load must overwrite them
            lambda m: [torch.nn.init.normal_(q) for q in m.parameters(recurse=False)]
        ),
        mesh,
    )
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=1e-3)
    model_state, optim_state = get_state_dict(restored, restored_optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=checkpoint)  # reads into the tensors of `state`, in place
    set_state_dict(restored, restored_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same_weights = all(
        per_rank(
            all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(restored.parameters(), fp32_model.parameters()))
        )
    )
    train(restored, restored_optimizer, batches[args.steps :])  # one more step, from both
    train(fp32_model, optimizer, batches[args.steps :])
    same_after_step = all(
        per_rank(
            all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(restored.parameters(), fp32_model.parameters()))
        )
    )
    print0(
        f"   dcp.load into a fresh sharded model: weights equal: {same_weights}; "
        f"equal after one more step (Adam state restored too): {same_after_step}"
    )

    # --- 3. CPU offload: keep the shards in host memory, move them to the GPU when needed ---
    try:
        offloaded = shard(make_model(device), mesh, offload_policy=CPUOffloadPolicy())
        train(offloaded, torch.optim.Adam(offloaded.parameters(), lr=1e-3), batches[:1])
        where = offloaded.blocks[0][0].weight.to_local().device
        print0(f"3. CPUOffloadPolicy: sharded weights live on {where.type}, compute on {device.type}")
    except RuntimeError as error:
        print0(f"3. CPUOffloadPolicy on this machine: {type(error).__name__}: {error}")
    return 0 if diff <= rtol and same_weights and same_after_step else 1


if __name__ == "__main__":
    exit_code = main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
    sys.exit(exit_code)
