"""The same pipeline with torch.distributed.pipelining: PipelineStage + ScheduleGPipe / Schedule1F1B.

    torchrun --standalone --nproc_per_node=2 c07_torch_pipelining.py [--microbatches 4]

Each rank builds the whole model from the same seed, keeps only its stage, and trains one SGD
step with each schedule; loss, gradients and weights are compared with the unsplit model.
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
    for key, value in [("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", free_port())]:
        os.environ.setdefault(key, value)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=30))
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


def loss_fn(output, target):
    return F.mse_loss(output, target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    args = parser.parse_args()
    if args.microbatches < 1 or BATCH % args.microbatches:
        parser.error(f"--microbatches must be a positive divisor of {BATCH}")
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)

    # the reference: the unsplit model, one SGD step on the whole batch
    full = make_model().to(device)
    ref_loss = loss_fn(full(x), y)
    ref_loss.backward()
    per_stage = len(full) // world_size
    mine = slice(rank * per_stage, (rank + 1) * per_stage)
    ref_grads = [p.grad.clone() for p in full[mine].parameters()]
    torch.optim.SGD(full.parameters(), lr=LR).step()
    ref_weights = [p.detach().clone() for p in full[mine].parameters()]

    print0(f"{world_size} stages of {per_stage // 2} layers, batch {BATCH} in {args.microbatches} "
           f"micro-batches, backend={dist.get_backend()} device={device.type}")
    for name, Schedule in [("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)]:
        stage_module = make_model()[mine].to(device)                    # only this rank's layers
        stage = PipelineStage(stage_module, stage_index=rank, num_stages=world_size, device=device)
        schedule = Schedule(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
        losses = []
        if rank == 0:
            schedule.step(x)                                            # the first stage feeds the input
        elif rank == world_size - 1:
            schedule.step(target=y, losses=losses)                      # the last stage gets the loss
        else:
            schedule.step()
        grads = [p.grad.clone() for p in stage_module.parameters()]
        torch.optim.SGD(stage_module.parameters(), lr=LR).step()
        diff = max(max((g - r).abs().max().item() for g, r in zip(grads, ref_grads)),
                   max((p - r).abs().max().item() for p, r in zip(stage_module.parameters(), ref_weights)))
        loss = torch.stack(losses).mean().item() if losses else 0.0   # mean of micro-batch losses
        results = [None] * world_size
        dist.all_gather_object(results, (diff, loss))
        loss_diff = abs(results[-1][1] - ref_loss.item())
        ok = max(d for d, _ in results) <= ATOL and loss_diff <= ATOL
        print0(f"{name:>5}: loss {results[-1][1]:.4f} (unsplit {ref_loss.item():.4f}); loss, gradients and "
               f"weights after one SGD step equal the unsplit model's: {ok} (max |difference| <= {ATOL:g})")


if __name__ == "__main__":
    main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
