"""Inside DDP, part 1: what DDP(...) does at construction, in backward(), and with its buckets.

    torchrun --standalone --nproc_per_node=2 c05_ddp_internals.py [--out DIR]

M1/M3 at construction, M2 in backward(); the buckets' all-reduce timeline goes to DIR/c05_buckets.json.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_setup import setup, teardown


def print0(text):
    """Print from rank 0 only, in one write (lines from several ranks never splice)."""
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def gathered(tensor):
    """This tensor from every rank, as a list in rank order."""
    tensors = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(tensors, tensor)
    return tensors


def flat(values):
    return torch.cat([v.detach().reshape(-1) for v in values])


def sync(device):
    """Wait for the GPU (nccl and CUDA kernels return before they finish); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_model(seed, device):
    torch.manual_seed(seed)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 1)).to(device)


def construction(device, rank):
    """1. Construction: a full replica per rank, rank 0's values broadcast (M1, M3)."""
    # A different initialisation on every rank.
    model = make_model(seed=rank, device=device)
    before = gathered(flat(model.parameters()))
    print0(f"before DDP(...): parameters equal on all ranks: {all(torch.equal(b, before[0]) for b in before)}")
    imported_before = set(sys.modules)
    start = time.perf_counter()
    ddp_model = DDP(model)
    first_ddp = time.perf_counter() - start
    dynamo = "torch._dynamo" in set(sys.modules) - imported_before
    after = gathered(flat(ddp_model.parameters()))
    print0(
        f"after  DDP(...): parameters equal on all ranks: {all(torch.equal(a, after[0]) for a in after)}; "
        f"equal to rank 0's initialisation: {torch.equal(after[0], before[0])}"
    )
    counts = gathered(torch.tensor([sum(p.numel() for p in ddp_model.parameters())], device=device))
    print0(
        "parameters held per rank: "
        + ", ".join(f"rank {r}: {c.item():,}" for r, c in enumerate(counts))
        + " (a full replica each: DDP splits the data, not the model)"
    )
    # A second one, for comparison.
    start = time.perf_counter()
    DDP(make_model(seed=0, device=device))
    print0(
        f"DDP(...) took {first_ddp:.2f} s the first time in this process (it imported torch._dynamo: {dynamo}), "
        f"{time.perf_counter() - start:.2f} s the second time"
    )
    return ddp_model


def when_averaged(ddp_model, device, rank):
    """2. When are gradients averaged? (M2) Returns this rank's batch."""
    phase = {"now": None}
    calls = {"backward": 0, "step": 0}

    def counting_hook(state, bucket):
        calls[phase["now"]] += 1
        # DDP's default: average the bucket over ranks.
        return allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    # Every rank its own data.
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(64, 512, generator=g).to(device), torch.randn(64, 1, generator=g).to(device)

    # The gradient each rank would have on its own (no DDP): a plain copy of the same module.
    local = make_model(seed=0, device=device)
    local.load_state_dict(ddp_model.module.state_dict())
    nn.functional.mse_loss(local(x), y).backward()
    local_grads = gathered(flat(p.grad for p in local.parameters()))
    print0(
        f"without DDP, local gradients equal on all ranks: {all(torch.equal(g_, local_grads[0]) for g_ in local_grads)}"
    )

    loss = nn.functional.mse_loss(ddp_model(x), y)
    phase["now"] = "backward"
    loss.backward()
    # Right after backward(), before step().
    grads = gathered(flat(p.grad for p in ddp_model.parameters()))
    mean = torch.stack(local_grads).mean(0)
    print0(
        f"with DDP, right after backward() and before step(): gradients identical on all ranks: "
        f"{all(torch.equal(g_, grads[0]) for g_ in grads)}; "
        f"equal to the mean of the local gradients within 1e-06: {(grads[0] - mean).abs().max().item() <= 1e-6}"
    )
    phase["now"] = "step"
    optimizer.step()
    print0(f"all-reduce calls during backward(): {calls['backward']}, during optimizer.step(): {calls['step']}")
    return x, y


def timing_hook(names, events):
    """A comm hook that averages each bucket as DDP does, and records when its all-reduce ran."""
    # names: id(parameter) -> its name in the model; events: the list the records go to.

    def hook(state, bucket):
        start = time.perf_counter()
        future = allreduce_hook(state, bucket)
        layers = sorted({names[id(p)].split(".")[0] for p in bucket.parameters()}, key=int)
        size_mb = bucket.buffer().numel() * bucket.buffer().element_size() / 2**20

        def record(fut):
            event = {"bucket": bucket.index(), "tensors": len(bucket.parameters()), "mb": size_mb, "layers": layers}
            events.append(dict(event, start=start, end=time.perf_counter()))
            return fut.value()

        return future.then(record)

    return hook


def timed_steps(ddp_model, x, y, device, events, steps=4):
    """Train steps; return the buckets after each backward() and when the last one began and ended."""
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    # DDP rebuilds its buckets at the start of step 2: time the last step, long after.
    counts = []
    for _ in range(steps):
        events.clear()
        loss = nn.functional.mse_loss(ddp_model(x), y)
        sync(device)
        t0 = time.perf_counter()
        loss.backward()
        sync(device)
        t_end = time.perf_counter()
        # Private, but exact.
        counts.append(len(ddp_model.reducer._get_zeros_like_grad_buckets()))
        optimizer.step()
        optimizer.zero_grad()
    return counts, t0, t_end


def buckets(x, y, device, out):
    """3. Buckets, and communication overlapping the rest of backward()."""
    timelines = {}
    # None: bucket_cap_mb left unset, DDP's default.
    for cap in [None, 25, 1]:
        model = make_model(seed=0, device=device)
        events = []
        ddp_model = DDP(model) if cap is None else DDP(model, bucket_cap_mb=cap)
        ddp_model.register_comm_hook(None, timing_hook({id(p): n for n, p in model.named_parameters()}, events))
        counts, t0, t_end = timed_steps(ddp_model, x, y, device, events)
        events.sort(key=lambda e: e["start"])
        print0(
            f"bucket_cap_mb {'unset (default)' if cap is None else f'= {cap}'}: {counts[0]} bucket(s) at step 1, "
            f"{counts[1]} at step 2, {counts[-1]} at step 4; "
            f"step 4's backward() returned after {1e3 * (t_end - t0):.1f} ms"
        )
        for e in events:
            print0(
                f"  bucket {e['bucket']}: {e['tensors']:2d} tensors, {e['mb']:.2f} MiB, "
                f"layers {','.join(e['layers']):>9}: "
                f"all-reduce from {1e3 * (e['start'] - t0):.1f} ms to {1e3 * (e['end'] - t0):.1f} ms"
            )
        timelines["unset" if cap is None else str(cap)] = {
            "backward_ms": 1e3 * (t_end - t0),
            "buckets": [dict(e, start=1e3 * (e["start"] - t0), end=1e3 * (e["end"] - t0)) for e in events],
        }
    if dist.get_rank() == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "c05_buckets.json").write_text(json.dumps(timelines, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="work", help="folder for c05_buckets.json (default: work)")
    args = parser.parse_args()
    device = setup()
    rank = dist.get_rank()
    ddp_model = construction(device, rank)
    x, y = when_averaged(ddp_model, device, rank)
    buckets(x, y, device, args.out)


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
