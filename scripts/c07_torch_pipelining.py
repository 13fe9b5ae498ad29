"""The same pipeline with torch.distributed.pipelining: PipelineStage + GPipe, 1F1B, interleaved 1F1B.

    torchrun --standalone --nproc_per_node=2 c07_torch_pipelining.py [--microbatches 4]

Each rank builds the whole model from the same seed, keeps only its stage (1 to 8 stages, the 8
layers split as evenly as they go), and trains one SGD step with ScheduleGPipe and Schedule1F1B;
then, with 2 chunks per rank (up to 4 ranks, m a multiple of them), one with ScheduleInterleaved1F1B.
Loss, gradients and weights are compared with the unsplit model. Exits with 1 if they differ.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from dist_setup import setup, teardown

WIDTH, LAYERS, BATCH, LR = 64, 8, 32, 0.1
ATOL = 1e-6


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


def parse_args():
    """The micro-batches per step; refuses, before joining the group, what the pipeline cannot run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, help="micro-batches per step (default: 4, 8 for 5+ stages)")
    args = parser.parse_args()
    # One stage per process.
    stages = int(os.environ.get("WORLD_SIZE", "1"))
    if stages > LAYERS:
        parser.error(f"{LAYERS} layers make at most {LAYERS} stages, not {stages}")
    m = args.microbatches or next(d for d in range(max(4, stages), BATCH + 1) if BATCH % d == 0)
    # Schedule1F1B refuses fewer micro-batches than stages.
    if m < stages or BATCH % m:
        parser.error(f"--microbatches must divide {BATCH} and be at least the number of stages ({stages})")
    return m


def reference_step(x, y, mine, device):
    """The unsplit model, one SGD step on the whole batch: its loss, and the gradients and updated
    weights of the layers in `mine` (this rank's stage)."""
    full = make_model().to(device)
    loss = loss_fn(full(x), y)
    loss.backward()
    grads = [p.grad.clone() for p in full[mine].parameters()]
    torch.optim.SGD(full.parameters(), lr=LR).step()
    weights = [p.detach().clone() for p in full[mine].parameters()]
    return loss.item(), grads, weights


def pipelined_step(Schedule, mine, m, x, y, device):
    """One SGD step of this rank's stage under `Schedule`: the stage's gradients, its weights after
    the step, and the mean loss of the micro-batches (on the last stage; 0.0 elsewhere)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Only this rank's layers.
    stage_module = make_model()[mine].to(device)
    stage = PipelineStage(stage_module, stage_index=rank, num_stages=world_size, device=device)
    schedule = Schedule(stage, n_microbatches=m, loss_fn=loss_fn)
    losses = []
    # The first stage feeds the input; the last gets the target and the losses (one stage: both).
    inputs = (x,) if rank == 0 else ()
    targets = {"target": y, "losses": losses} if rank == world_size - 1 else {}
    schedule.step(*inputs, **targets)
    grads = [p.grad.clone() for p in stage_module.parameters()]
    torch.optim.SGD(stage_module.parameters(), lr=LR).step()
    # The mean of the micro-batches' losses: equal micro-batches make it the whole batch's.
    loss = torch.stack(losses).mean().item() if losses else 0.0
    return grads, [p.detach() for p in stage_module.parameters()], loss


def main():
    m = parse_args()
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)
    mine = stage_slice(rank, world_size)
    ref_loss, ref_grads, ref_weights = reference_step(x, y, mine, device)

    # Layers per stage: each layer is two modules, a Linear and a Tanh.
    slices = [stage_slice(s, world_size) for s in range(world_size)]
    sizes = sorted({(s.stop - s.start) // 2 for s in slices})
    print0(
        f"{world_size} stage(s) of {' or '.join(map(str, sizes))} layers, batch {BATCH} in {m} "
        f"micro-batches, backend={dist.get_backend()} device={device.type}"
    )
    failed = False
    for name, Schedule in [("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B), ("Interleaved 1F1B", None)]:
        if Schedule is None:
            # Two chunks per rank: 2 x world_size virtual stages, at most one per layer.
            if 2 * world_size > LAYERS or m % world_size:
                print0(f"{name}: not run (2 chunks per rank need at most {LAYERS // 2} ranks, m a multiple of them)")
                continue
            grads, weights, loss, (expected_grads, expected_weights) = interleaved_step(2, m, x, y, device)
        else:
            grads, weights, loss = pipelined_step(Schedule, mine, m, x, y, device)
            expected_grads, expected_weights = ref_grads, ref_weights
        diff = max(
            max((g - r).abs().max().item() for g, r in zip(grads, expected_grads)),
            max((p - r).abs().max().item() for p, r in zip(weights, expected_weights)),
        )
        # Every stage's largest difference, and the last stage's loss.
        results = [None] * world_size
        dist.all_gather_object(results, (diff, loss))
        ok = max(d for d, _ in results) <= ATOL and abs(results[-1][1] - ref_loss) <= ATOL
        failed |= not ok
        print0(
            f"{name:>5}: loss {results[-1][1]:.4f} (unsplit {ref_loss:.4f}); loss, gradients and "
            f"weights after one SGD step equal the unsplit model's: {ok} (max |difference| <= {ATOL:g})"
        )
    return 1 if failed else 0


def interleaved_step(n_chunks, m, x, y, device):
    """One SGD step under ScheduleInterleaved1F1B with n_chunks stages on this rank: their gradients
    and weights after the step (one list, stage after stage), the mean loss (on the last rank; 0.0
    elsewhere), and the unsplit model's gradients and weights of the same layers."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    n_virtual = n_chunks * world_size
    # This rank's virtual stages: a micro-batch goes round the ranks n_chunks times.
    virtual = [rank + chunk * world_size for chunk in range(n_chunks)]
    mine = [stage_slice(v, n_virtual) for v in virtual]
    modules = [make_model()[layers].to(device) for layers in mine]
    stages = [PipelineStage(module, v, n_virtual, device) for module, v in zip(modules, virtual)]
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    losses = []
    # Virtual stage 0 is on rank 0, the last one on the last rank.
    inputs = (x,) if rank == 0 else ()
    targets = {"target": y, "losses": losses} if rank == world_size - 1 else {}
    schedule.step(*inputs, **targets)
    parameters = [p for module in modules for p in module.parameters()]
    grads = [p.grad.clone() for p in parameters]
    torch.optim.SGD(parameters, lr=LR).step()
    loss = torch.stack(losses).mean().item() if losses else 0.0
    references = [reference_step(x, y, layers, device) for layers in mine]
    expected = [g for _, gs, _ in references for g in gs], [w for _, _, ws in references for w in ws]
    return grads, [p.detach() for p in parameters], loss, expected


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
