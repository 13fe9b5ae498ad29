"""The same pipeline with torch.distributed.pipelining: PipelineStage + ScheduleGPipe / Schedule1F1B.

    torchrun --standalone --nproc_per_node=2 c07_torch_pipelining.py [--microbatches 4]

Each rank builds the whole model from the same seed, keeps only its stage (1 to 8 stages, the 8
layers split as evenly as they go), and trains one SGD step with each schedule; loss, gradients
and weights are compared with the unsplit model. Exits with 1 if they differ.
"""

import argparse
import gc
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

WIDTH, LAYERS, BATCH, LR = 64, 8, 32, 0.1
ATOL = 1e-6


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


def print0(text):
    """Print from rank 0 only, in one write (lines from several ranks never splice)."""
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def make_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def stage_slice(stage, n_stages):
    """The modules of one stage: whole (Linear, Tanh) layers, as evenly split as they go."""
    start, stop = (k * LAYERS // n_stages for k in (stage, stage + 1))
    return slice(2 * start, 2 * stop)


def loss_fn(output, target):
    return F.mse_loss(output, target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, help="micro-batches per step (default: 4, 8 for 5+ stages)")
    args = parser.parse_args()
    stages = int(os.environ.get("WORLD_SIZE", "1"))  # one stage per process
    if stages > LAYERS:
        parser.error(f"{LAYERS} layers make at most {LAYERS} stages, not {stages}")
    m = args.microbatches or next(d for d in range(max(4, stages), BATCH + 1) if BATCH % d == 0)
    if m < stages or BATCH % m:  # Schedule1F1B refuses fewer micro-batches than stages
        parser.error(f"--microbatches must divide {BATCH} and be at least the number of stages ({stages})")
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)

    # the reference: the unsplit model, one SGD step on the whole batch
    full = make_model().to(device)
    ref_loss = loss_fn(full(x), y)
    ref_loss.backward()
    mine = stage_slice(rank, world_size)
    ref_grads = [p.grad.clone() for p in full[mine].parameters()]
    torch.optim.SGD(full.parameters(), lr=LR).step()
    ref_weights = [p.detach().clone() for p in full[mine].parameters()]

    sizes = sorted({len(full[stage_slice(s, world_size)]) // 2 for s in range(world_size)})
    print0(
        f"{world_size} stage(s) of {' or '.join(map(str, sizes))} layers, batch {BATCH} in {m} "
        f"micro-batches, backend={dist.get_backend()} device={device.type}"
    )
    failed = False
    for name, Schedule in [("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)]:
        stage_module = make_model()[mine].to(device)  # only this rank's layers
        stage = PipelineStage(stage_module, stage_index=rank, num_stages=world_size, device=device)
        schedule = Schedule(stage, n_microbatches=m, loss_fn=loss_fn)
        losses = []
        # The first stage feeds the input; the last gets the target and the losses (one stage: both).
        inputs = (x,) if rank == 0 else ()
        targets = {"target": y, "losses": losses} if rank == world_size - 1 else {}
        schedule.step(*inputs, **targets)
        grads = [p.grad.clone() for p in stage_module.parameters()]
        torch.optim.SGD(stage_module.parameters(), lr=LR).step()
        diff = max(
            max((g - r).abs().max().item() for g, r in zip(grads, ref_grads)),
            max((p - r).abs().max().item() for p, r in zip(stage_module.parameters(), ref_weights)),
        )
        loss = torch.stack(losses).mean().item() if losses else 0.0  # mean of micro-batch losses
        results = [None] * world_size
        dist.all_gather_object(results, (diff, loss))
        loss_diff = abs(results[-1][1] - ref_loss.item())
        ok = max(d for d, _ in results) <= ATOL and loss_diff <= ATOL
        failed |= not ok
        print0(
            f"{name:>5}: loss {results[-1][1]:.4f} (unsplit {ref_loss.item():.4f}); loss, gradients and "
            f"weights after one SGD step equal the unsplit model's: {ok} (max |difference| <= {ATOL:g})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    exit_code = main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
    sys.exit(exit_code)
