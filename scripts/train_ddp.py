"""Train a linear regression with DistributedDataParallel, and survive crashes: the reference script.

    python train_ddp.py --out work/run1                                     # one process
    torchrun --standalone --nproc_per_node=4 train_ddp.py --out work/run4   # four processes
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 train_ddp.py \\
        --out work/run --checkpoint-dir work/ckpt --checkpoint-every 4      # resumes after a crash

The same --global-batch-size and --seed give the same final weights at every world size (up to
float rounding); a run that crashed and resumed from --checkpoint-dir ends with the same weights,
bit for bit, as one that did not.
Writes data.pt, final.pt (the model's state_dict) and metrics.json to --out (chapters 04 and 09).
"""

import argparse
import gc
import itertools
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from train_single import SimpleModel, make_data  # the model and the data of chapter 04

CHECKPOINT = "last.pt"  # the one file a restart resumes from
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # 0, then 1, 2, ... after restarts


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a linear regression with DDP; resume after crashes.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch-size", type=int, default=64, help="samples per step, all ranks together")
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic data set")
    parser.add_argument("--seed", type=int, default=0, help="fixes the data, the shuffle and the init")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, required=True, help="folder for data.pt, final.pt, metrics.json")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help=f"resume from DIR/{CHECKPOINT} if it exists; save it every --checkpoint-every steps",
    )
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="K", help="steps between checkpoints")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30,  # a hung collective fails after this
        help="seconds a collective may wait for the other ranks before it is an error",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        metavar="K",  # a teaching switch
        help="rank --fail-rank fails in step K (first attempt only: restarts run normally)",
    )
    parser.add_argument("--fail-rank", type=int, default=0, metavar="R")
    parser.add_argument(
        "--fail-how",
        choices=["crash", "hang"],
        default="crash",
        help="crash: raise an error; hang: stop answering (the others time out)",
    )
    args = parser.parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if min(args.epochs, args.samples, args.global_batch_size, args.checkpoint_every) < 1:
        parser.error("--epochs, --samples, --global-batch-size and --checkpoint-every must be at least 1")
    if args.global_batch_size % world_size:
        parser.error(f"--global-batch-size {args.global_batch_size} is not divisible by the world size {world_size}")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    if args.checkpoint_dir is not None and args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        parser.error(f"--checkpoint-dir {args.checkpoint_dir} exists and is not a folder")
    if args.fail_at_step is not None and (args.fail_at_step < 1 or not 0 <= args.fail_rank < world_size):
        parser.error(f"--fail-at-step must be >= 1 and --fail-rank in [0, {world_size})")
    return args


def run_config(args):  # what must match for a checkpoint to belong to this run
    return {"global_batch_size": args.global_batch_size, "samples": args.samples, "seed": args.seed, "lr": args.lr}


def load_checkpoint(args, device):
    """The last checkpoint's state on `device`, or None; exits with one line if it is unusable."""
    if args.checkpoint_dir is None or not (args.checkpoint_dir / CHECKPOINT).exists():
        return None  # a first start
    path = args.checkpoint_dir / CHECKPOINT
    try:  # tensors, numbers, strings and lists only: no code runs while loading
        state = torch.load(path, map_location=device, weights_only=True)  # onto this rank's device
    except Exception as e:  # truncated, corrupted, not a checkpoint at all
        sys.exit(
            f"train_ddp.py: error: cannot read checkpoint {path} ({type(e).__name__}); "
            "move it away to start from scratch"
        )  # never a silent fresh start
    if not isinstance(state, dict) or state.get("config") != run_config(args):
        sys.exit(
            f"train_ddp.py: error: checkpoint {path} belongs to another run "
            f"(its settings: {state.get('config') if isinstance(state, dict) else None})"
        )
    return state


def save_checkpoint(args, state):
    """Write the checkpoint atomically: a crash mid-write leaves the previous one intact."""
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = args.checkpoint_dir / f"{CHECKPOINT}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before it replaces the old one
    os.replace(tmp, args.checkpoint_dir / CHECKPOINT)  # atomic on POSIX file systems


def setup(timeout):  # a configurable timeout
    """Pick backend and device from what is present, and join the process group."""
    launched = "RANK" in os.environ  # torchrun (or mp.spawn) set RANK, LOCAL_RANK, ...
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # 0 without torchrun; not RANK
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # 1 without torchrun
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    timeout, device_id = timedelta(seconds=timeout), device if backend == "nccl" else None
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's store outlives restarts,
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),  # earlier
            is_master=False,
            timeout=timeout,
        )  # attempts' keys included
        # RESTART counts this node's restarts after failures: distinct attempts on one node
        store = dist.PrefixStore(f"attempt_{RESTART}", store)  # so each attempt gets its own keys
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
        )
    elif launched:  # RANK... set by hand, or torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)  # a store at MASTER_ADDR:MASTER_PORT
    else:  # plain `python train_ddp.py`: a group of one, in memory, no port needed
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    return backend, device


def fail_here(args, rank, step):  # the teaching switch, first attempt only
    if args.fail_at_step != step or args.fail_rank != rank or RESTART > 0:
        return
    if args.fail_how == "hang":  # alive but silent, like a rank stuck in I/O or a deadlock
        time.sleep(10 * args.timeout)  # the others' collectives time out long before
    raise RuntimeError(f"injected failure: rank {rank} in step {step}")


@record  # under torchrun, the traceback goes to TORCHELASTIC_ERROR_FILE for the launcher's report
def main(argv=None):
    args = parse_args(argv)
    backend, device = setup(args.timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch_size = args.global_batch_size // world_size  # per rank
    if rank == 0:  # rank 0 speaks for the job
        sys.stdout.write(
            f"backend={backend} device={device.type} world_size={world_size} "
            f"global batch {args.global_batch_size}, per rank {batch_size}\n"
        )
    resume = load_checkpoint(args, device)  # every rank reads the same file

    # Rank 0 "downloads" the data set; the others wait for it at the barrier.
    data_file = args.out / "data.pt"
    if rank == 0:  # one writer
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(make_data(args.samples, args.seed), data_file)
    dist.barrier()  # nobody reads before rank 0 has written
    data = torch.load(data_file, weights_only=True)
    dataset = TensorDataset(data["X"], data["y"])
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)  # same permutation on every rank
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)

    torch.manual_seed(args.seed)  # the same initial weights on every run (DDP also broadcasts rank 0's)
    model = SimpleModel().to(device)  # move first, then wrap
    if resume is not None:  # before wrapping: DDP then broadcasts the resumed weights
        model.load_state_dict(resume["model"])
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch, done_in_epoch, step, losses = 0, 0, 0, []  # where a first start begins
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])  # momentum buffers too (M18)
        start_epoch, done_in_epoch = resume["epoch"], resume["step_in_epoch"]
        step, losses = resume["step"], resume["losses"]
        if rank == 0:
            sys.stdout.write(
                f"attempt {RESTART}: resumed from {args.checkpoint_dir / CHECKPOINT} "
                f"at step {step} (epoch {start_epoch + 1}, "
                f"{done_in_epoch} of {len(loader)} steps done)\n"
            )

    for epoch in range(start_epoch, args.epochs):  # from the checkpoint's epoch
        sampler.set_epoch(epoch)  # a new order every epoch
        running_loss = torch.zeros((), device=device)  # a tensor, to all-reduce it
        batches = iter(loader)  # draws from the global RNG, as it did before the crash
        if resume is not None and epoch == start_epoch:  # the interrupted epoch
            batches = itertools.islice(batches, done_in_epoch, None)  # skip the steps already done
            torch.set_rng_state(resume["rng"]["cpu"].cpu())  # RNG as at the checkpoint
            if device.type == "cuda":
                torch.cuda.set_rng_state(resume["rng"]["cuda"].cpu())
            if rank == 0:  # the epoch's loss so far, summed over ranks, counted once
                running_loss += resume["loss_sum"]
        for i, (X, y) in enumerate(batches, start=done_in_epoch if epoch == start_epoch else 0):
            fail_here(args, rank, step + 1)
            X, y = X.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.mse_loss(ddp_model(X), y)
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            running_loss += loss.detach()  # no .item(): no GPU sync every step
            step += 1
            if args.checkpoint_dir is not None and step % args.checkpoint_every == 0:  # same on all ranks
                loss_sum = running_loss.clone()
                dist.all_reduce(loss_sum)  # a collective: every rank takes part
                if rank == 0:  # one writer; the replicas are identical
                    save_checkpoint(
                        args,
                        {
                            "config": run_config(args),
                            "epoch": epoch,
                            "step_in_epoch": i + 1,
                            "step": step,
                            "model": ddp_model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "losses": losses,
                            "loss_sum": loss_sum,
                            "rng": {
                                "cpu": torch.get_rng_state(),
                                "cuda": torch.cuda.get_rng_state() if device.type == "cuda" else torch.empty(0),
                            },
                        },
                    )
        epoch_loss = running_loss / len(loader)  # rank 0's running_loss holds the restored sum too
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)  # mean over ranks; each ran len(loader) batches,
        losses.append(epoch_loss.item())  # so this is the mean loss over all batches of all ranks
        if rank == 0:
            sys.stdout.write(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}\n")

    if rank == 0:  # one writer
        torch.save(ddp_model.module.state_dict(), args.out / "final.pt")  # the model inside DDP
        metrics = {
            "world_size": world_size,
            "global_batch_size": args.global_batch_size,
            "epochs": args.epochs,
            "loss": losses,  # the global mean loss per epoch
            "steps": step,
            "restarts": RESTART,
        }
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    dist.barrier()  # the checkpoint is complete before anyone reads it
    state = torch.load(args.out / "final.pt", map_location=device, weights_only=True)
    replica = ddp_model.module.state_dict()  # each rank compares the file with its replica
    agree = torch.tensor([float(all(torch.equal(state[k], replica[k]) for k in state))], device=device)
    dist.all_reduce(agree)  # rank 0 counts the ranks that agree
    if rank == 0:
        sys.stdout.write(
            f"rank 0 wrote {args.out / 'final.pt'} and metrics.json; "
            f"{int(agree.item())} of {world_size} ranks reloaded it: equal to their replica\n"
        )


if __name__ == "__main__":
    main()
    if dist.is_initialized():  # not after --help, which @record turns into a plain return
        gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
        dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
