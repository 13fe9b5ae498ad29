"""Train a linear regression with DistributedDataParallel, and survive crashes: the course's
reference script (chapter 04's c04_train_ddp.py, with the checkpoints of chapter 09).

    python train_ddp.py --out work/run1                                     # one process
    torchrun --standalone --nproc_per_node=4 train_ddp.py --out work/run4   # four processes
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py \\
        --out work/run --checkpoint-dir work/ckpt --checkpoint-every 4      # resumes after a crash

The same --global-batch-size and --seed give the same final weights at every world size (up to
float rounding); a run that crashed and resumed from --checkpoint-dir ends with the same weights,
bit for bit, as one that did not. Writes data.pt, final.pt (the model's state_dict) and
metrics.json to --out. Keep c04_train_ddp.py, train_single.py and dist_setup.py beside it.
"""

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

from c04_train_ddp import add_arguments, check_arguments, make_loader, make_model, save_results
from dist_setup import setup, teardown

# The one file a restart resumes from.
CHECKPOINT = "last.pt"
# 0 on the first attempt; torchrun counts 1, 2, ... after each restart.
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a linear regression with DDP; resume after crashes.")
    add_arguments(parser)
    parser.add_argument(
        "--checkpoint-dir", type=Path, help=f"resume from DIR/{CHECKPOINT} if it exists; save it every K steps"
    )
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="K", help="steps between checkpoints")
    parser.add_argument(
        "--timeout", type=float, default=30, help="seconds a collective may wait for the other ranks: then an error"
    )
    # A teaching switch: break one rank on purpose.
    parser.add_argument(
        "--fail-at-step", type=int, metavar="K", help="rank --fail-rank fails in step K (first attempt only)"
    )
    parser.add_argument("--fail-rank", type=int, default=0, metavar="R")
    parser.add_argument(
        "--fail-how",
        choices=["crash", "hang"],
        default="crash",
        help="crash: raise an error; hang: stop answering (the others time out)",
    )
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.checkpoint_every < 1:
        parser.error("--checkpoint-every must be at least 1")
    if not args.timeout > 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.checkpoint_dir is not None and args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        parser.error(f"--checkpoint-dir {args.checkpoint_dir} exists and is not a folder")
    if args.fail_at_step is not None and (args.fail_at_step < 1 or not 0 <= args.fail_rank < world_size):
        parser.error(f"--fail-at-step must be >= 1 and --fail-rank in [0, {world_size})")
    return args


def run_config(args):
    """What must match for a checkpoint to belong to this run."""
    return {"global_batch_size": args.global_batch_size, "samples": args.samples, "seed": args.seed, "lr": args.lr}


def save_checkpoint(args, state):
    """Write the checkpoint atomically: a crash mid-write leaves the previous one intact."""
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = args.checkpoint_dir / f"{CHECKPOINT}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        # On disk before it replaces the old one.
        os.fsync(f.fileno())
    # Atomic on POSIX file systems: a reader sees the old file or the new one.
    os.replace(tmp, args.checkpoint_dir / CHECKPOINT)


def load_checkpoint(args, device):
    """The last checkpoint's state on `device`, or None; exits with one line if it is unusable."""
    path = None if args.checkpoint_dir is None else args.checkpoint_dir / CHECKPOINT
    if path is None or not path.exists():
        return None
    try:
        # weights_only: tensors, numbers, strings and lists; no code runs while loading.
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        # Truncated, corrupted, not a checkpoint at all: never a silent fresh start.
        sys.exit(f"train_ddp.py: error: cannot read checkpoint {path} ({type(e).__name__}); move it away to start over")
    if not isinstance(state, dict) or state.get("config") != run_config(args):
        found = state.get("config") if isinstance(state, dict) else None
        sys.exit(f"train_ddp.py: error: checkpoint {path} belongs to another run (its settings: {found})")
    return state


def fail_here(args, step):
    """The teaching switch: rank --fail-rank fails in step --fail-at-step, on the first attempt only."""
    if args.fail_at_step != step or args.fail_rank != dist.get_rank() or RESTART > 0:
        return
    if args.fail_how == "hang":
        # Alive but silent, like a rank stuck in I/O or a deadlock: the others time out long before.
        time.sleep(10 * args.timeout)
    raise RuntimeError(f"injected failure: rank {dist.get_rank()} in step {step}")


def train_epoch(args, ddp_model, loader, optimizer, device, run):
    """One epoch from where `run` stands (mid-epoch after a restart), a checkpoint every K steps;
    returns the epoch's mean loss over all batches of all ranks."""
    # A tensor, not a float: no .item(), so no wait for the GPU at every step.
    running_loss = torch.zeros((), device=device)
    # iter() draws the loader's seed from the global RNG, before the crash as after it.
    batches = iter(loader)
    if run["step_in_epoch"] > 0:
        # The interrupted epoch: skip the steps already done, and restore the RNG as it was.
        batches = itertools.islice(batches, run["step_in_epoch"], None)
        torch.set_rng_state(run["rng"]["cpu"].cpu())
        if device.type == "cuda":
            torch.cuda.set_rng_state(run["rng"]["cuda"].cpu())
        # The epoch's loss so far, summed over ranks: counted once, on rank 0.
        if dist.get_rank() == 0:
            running_loss += run["loss_sum"]
    for X, y in batches:
        fail_here(args, run["step"] + 1)
        X, y = X.to(device), y.to(device)
        optimizer.zero_grad()
        # MSE on a real target: there is something to learn.
        loss = F.mse_loss(ddp_model(X), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.detach()
        run["step"] += 1
        run["step_in_epoch"] += 1
        # The same step on every rank: they all take part in the all-reduce.
        if args.checkpoint_dir is not None and run["step"] % args.checkpoint_every == 0:
            run["loss_sum"] = running_loss.clone()
            dist.all_reduce(run["loss_sum"])
            run["rng"] = {"cpu": torch.get_rng_state()}
            if device.type == "cuda":
                run["rng"]["cuda"] = torch.cuda.get_rng_state()
            # One writer: the replicas are equal.
            if dist.get_rank() == 0:
                model_state = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint(args, {**run, **model_state})
    run["step_in_epoch"] = 0
    # Divided by the number of batches, not by the index of the last one (M10). Each rank ran
    # len(loader) batches: the mean over ranks is the mean over all batches.
    epoch_loss = running_loss / len(loader)
    dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)
    return epoch_loss.item()


def resume(args, ddp_model, optimizer, device, steps_per_epoch):
    """Where training stands: at the start, or as the last checkpoint left it (loaded into the
    model and the optimizer, momentum buffers included: M18)."""
    state = load_checkpoint(args, device)
    if state is None:
        return {"config": run_config(args), "epoch": 0, "step_in_epoch": 0, "step": 0, "losses": []}
    ddp_model.module.load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    if dist.get_rank() == 0:
        sys.stdout.write(
            f"attempt {RESTART}: resumed from {args.checkpoint_dir / CHECKPOINT} at step {state['step']} "
            f"(epoch {state['epoch'] + 1}, {state['step_in_epoch']} of {steps_per_epoch} steps done)\n"
        )
    return state


# Under torchrun, @record writes the traceback to TORCHELASTIC_ERROR_FILE for torchrun's report.
@record
def main(argv=None):
    args = parse_args(argv)
    device = setup(timeout_s=args.timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = make_loader(args)
    # Rank 0 speaks for the job.
    if rank == 0:
        sys.stdout.write(
            f"backend={dist.get_backend()} device={device.type} world_size={world_size} "
            f"global batch {args.global_batch_size}, per rank {loader.batch_size}\n"
        )
    ddp_model, optimizer = make_model(args, device)
    run = resume(args, ddp_model, optimizer, device, len(loader))
    # From the epoch of the checkpoint, if there was one.
    while run["epoch"] < args.epochs:
        # A new order every epoch (M5): after a restart, the order the crashed epoch had.
        loader.sampler.set_epoch(run["epoch"])
        run["losses"].append(train_epoch(args, ddp_model, loader, optimizer, device, run))
        run["epoch"] += 1
        if rank == 0:
            sys.stdout.write(f"epoch {run['epoch']}/{args.epochs}: loss {run['losses'][-1]:.4f}\n")
    metrics = {"world_size": world_size, "global_batch_size": args.global_batch_size, "epochs": args.epochs}
    metrics.update(loss=run["losses"], steps=run["step"], restarts=RESTART)
    agree = save_results(args, ddp_model, metrics, device)
    if rank == 0:
        sys.stdout.write(
            f"rank 0 wrote {args.out / 'final.pt'} and metrics.json; "
            f"{agree} of {world_size} ranks reloaded it: equal to their replica\n"
        )
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
