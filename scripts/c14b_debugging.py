"""Chapter 14b: a hung job, a mismatched job and a straggler, with the records that find the culprit.

    torchrun --standalone --nproc_per_node=2 c14b_debugging.py stuck --out DIR
    torchrun --standalone --nproc_per_node=2 c14b_debugging.py mismatch --out DIR
    torchrun --standalone --nproc_per_node=2 c14b_debugging.py straggler --out DIR

Each step all-reduces a gradient. torch's flight recorder keeps the last collectives each rank
entered: in torch 2.13 it is on by default, 2000 entries per rank (TORCH_FR_BUFFER_SIZE=0 turns it
off), on gloo as on nccl.

stuck:     at step --bug-step, rank --culprit is stuck in load_batch(); the others wait in the
           all-reduce until --timeout.
mismatch:  at step --bug-step, rank 0 alone gathers the full weights for a checkpoint (a collective
           called on one rank only); the others go on to the next step's all-reduce.
straggler: rank --culprit spends --delay seconds more per step outside the collectives; every rank
           records, per step, its time outside the all-reduce and inside it (DIR/straggler.json).

Every rank joins with setup()'s own timeout, then gives its collectives --timeout: a short timeout
that also bounded the join would fail a node whose ranks start unevenly (on nccl the join waits for
rank 0's unique id in the store). stuck and mismatch run on gloo: with GPUs, hide them
(CUDA_VISIBLE_DEVICES=); on nccl a timed-out collective ends the process and, by default
(TORCH_NCCL_DUMP_ON_TIMEOUT), every rank's heartbeat monitor writes its record to
${XDG_CACHE_HOME:-~/.cache}/torch/comm_lib_trace_rank_<rank> (or TORCH_FR_DUMP_TEMP_FILE + rank).
In both, the first rank whose collective times out asks every rank, through the store, to dump its
flight record (DIR/fr/rank_R), as nccl does; each rank writes its pid to DIR/ready_rank_R when it
reaches the bug, and its Python stack to DIR/stack_rank_R.txt on SIGUSR1 (faulthandler). Both exit
with code 1: the job failed.
"""

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dist_setup import pick_device, setup, teardown
from parallel_course.compat import all_gather_single, set_collective_timeout

# The store key that asks every rank for its flight record, and the count of records written.
DUMP_KEY, DUMPED_KEY = "c14b/dump_flight_record", "c14b/flight_records_written"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["stuck", "mismatch", "straggler"])
    parser.add_argument("--out", type=Path, required=True, help="folder for the records")
    parser.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    parser.add_argument("--bug-step", type=int, default=3, help="stuck, mismatch: the step that goes wrong (default 3)")
    parser.add_argument("--culprit", type=int, default=-1, help="the stuck or slow rank (default: the last)")
    parser.add_argument(
        "--timeout", type=float, default=4.0, help="seconds a collective may wait, the join excepted (default 4)"
    )
    parser.add_argument("--delay", type=float, default=0.2, help="straggler: extra seconds per step (default 0.2)")
    args = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.mode != "straggler" and world_size < 2:
        parser.error(f"{args.mode} needs at least 2 processes (a rank to wait for another), got {world_size}")
    if args.culprit == -1:
        args.culprit = world_size - 1
    if not 0 <= args.culprit < world_size:
        parser.error(f"--culprit must be a rank of the {world_size} processes, got {args.culprit}")
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.mode != "straggler" and not 0 <= args.bug_step < args.steps:
        parser.error(f"--bug-step must be a step of the --steps {args.steps}, got {args.bug_step}")
    if args.timeout <= 0 or args.delay < 0:
        parser.error("--timeout must be positive and --delay not negative")
    # On nccl a timed-out collective never returns to Python: the watchdog ends the process (and
    # the heartbeat monitor dumps the record itself). These two modes show the record on gloo.
    if args.mode != "straggler" and pick_device().type == "cuda":
        parser.error(f"{args.mode} shows gloo's flight record: hide the GPUs (CUDA_VISIBLE_DEVICES=)")
    return args


def compute(grad, seconds=0.0):
    """A step's forward and backward: some arithmetic, plus ``seconds`` of a slow input pipeline."""
    time.sleep(seconds)
    for _ in range(20):
        grad = torch.tanh(grad @ grad.T / grad.shape[1]) @ grad
    return grad


def load_batch(seconds):
    """Stands for a read from a dead file system, a deadlock, ..."""
    time.sleep(seconds)


def gather_full_weights(weights):
    """What a sharded model's full state_dict() does: an all-gather that every rank must join."""
    full = torch.empty(dist.get_world_size() * weights.numel())
    # dist.all_gather_single in torch 2.13, all_gather_into_tensor before it.
    all_gather_single(full, weights)
    return full


class FlightRecord:
    """Writes this rank's flight record once: when its own collective fails, or when another rank
    asks through the store (a thread polls for the key while the main thread is stuck)."""

    def __init__(self, out, store):
        self.path = out / "fr" / f"rank_{dist.get_rank()}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.store, self.lock, self.done = store, threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._wait_for_request, daemon=True)
        self.thread.start()

    def _wait_for_request(self):
        while not self.done.wait(0.05):
            if self.store.check([DUMP_KEY]):
                self.dump()

    def dump(self):
        with self.lock:
            if self.path.exists():
                return
            # A pickle of this rank's entries, the format torch's analyzer reads: collectives
            # included, finished ones too, but no stacks, Python's nor C++'s (the entries then have
            # no "frames"): the first dump with stacks takes seconds to symbolise them.
            record = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(record)
            os.replace(tmp, self.path)
            self.store.add(DUMPED_KEY, 1)

    def timed_out(self, timeout):
        """Ask every rank for its record, write this one, and wait (bounded) for all of them."""
        self.store.set(DUMP_KEY, str(dist.get_rank()))
        self.dump()
        deadline = time.monotonic() + timeout
        while self.store.add(DUMPED_KEY, 0) < dist.get_world_size() and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self):
        self.done.set()
        self.thread.join()


def ready(out, rank):
    """Tell the outside (the notebook, a debugger) this rank's pid, now that it is at the bug."""
    (out / f"ready_rank_{rank}").write_text(str(os.getpid()))


def train(args, device):
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    record = FlightRecord(args.out, store)
    # On SIGUSR1, the Python stack of every thread goes to stack_rank_R.txt, even while the main
    # thread waits in C++ (faulthandler writes from its C signal handler).
    stack_file = open(args.out / f"stack_rank_{rank}.txt", "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    torch.manual_seed(rank)
    weights = torch.randn(64, device=device)
    grad = torch.randn(64, 64, device=device)
    try:
        for step in range(args.steps):
            if step == args.bug_step and args.mode == "stuck" and rank == args.culprit:
                ready(args.out, rank)
                load_batch(3 * args.timeout)
            grad = compute(grad)
            if step == args.bug_step:
                # Right before the collective: where a debugger will find this rank.
                ready(args.out, rank)
                if args.mode == "mismatch" and rank == 0:
                    # The bug: a collective inside `if rank == 0`.
                    weights = gather_full_weights(weights)[: weights.numel()]
            dist.all_reduce(grad)
            grad /= dist.get_world_size()
    except RuntimeError as e:
        sys.stdout.write(f"rank {rank}: the collective failed at step {step}: {type(e).__name__}\n")
        record.timed_out(args.timeout)
        return 1
    finally:
        record.close()
        faulthandler.unregister(signal.SIGUSR1)
        stack_file.close()
    return 0


def straggler(args, device):
    """Per step: seconds outside the all-reduce (compute, input) and inside it (waiting included)."""
    rank = dist.get_rank()
    grad = torch.randn(64, 64, device=device)
    times = torch.zeros(args.steps, 2, dtype=torch.float64)
    for step in range(args.steps):
        start = time.perf_counter()
        grad = compute(grad, args.delay if rank == args.culprit else 0.0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        entered = time.perf_counter()
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[step] = torch.tensor([entered - start, time.perf_counter() - entered])
    # Every rank's times to rank 0 (all_gather: gloo and nccl both have it).
    gathered = [torch.zeros_like(times, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, times.to(device))
    if rank == 0:
        result = {
            "outside_s": [t[:, 0].tolist() for t in gathered],
            "inside_s": [t[:, 1].tolist() for t in gathered],
            "slowed_rank": args.culprit,
            "delay_s": args.delay,
        }
        (args.out / "straggler.json").write_text(json.dumps(result, indent=1))
    return 0


def join(args):
    """Join with setup()'s own timeout, then give the collectives --timeout."""
    device = setup()
    set_collective_timeout(args.timeout)
    return device


def main():
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = join(args)
    if args.mode == "straggler":
        return straggler(args, device)
    return train(args, device)


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
