"""Inside DDP, part 1: what DistributedDataParallel does at construction and in backward().

    torchrun --standalone --nproc_per_node=2 c05_ddp_internals.py [--out DIR]

1. M1/M3: every rank holds a full replica; DDP(...) broadcasts rank 0's parameters.
2. M2: gradients are averaged during backward(), not in optimizer.step().
3. Buckets: how many, with bucket_cap_mb unset (the default), 25 and 1, before and after DDP
   rebuilds them; a communication hook records when each bucket's all-reduce starts and ends
   (written to DIR/c05_buckets.json for a timeline plot).
"""

import argparse
import gc
import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP


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
    model = make_model(seed=rank, device=device)  # a different initialisation on every rank
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
    start = time.perf_counter()
    DDP(make_model(seed=0, device=device))  # a second one, for comparison
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
        return allreduce_hook(state, bucket)  # DDP's default: average the bucket over ranks

    ddp_model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(100 + rank)  # every rank its own data
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
    grads = gathered(flat(p.grad for p in ddp_model.parameters()))  # right after backward()
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


def buckets(x, y, device, out):
    """3. Buckets, and communication overlapping the rest of backward()."""
    names = {}
    events = []

    def timing_hook(state, bucket):
        start = time.perf_counter()
        future = allreduce_hook(state, bucket)
        layers = sorted({names[id(p)].split(".")[0] for p in bucket.parameters()}, key=int)
        size_mb = bucket.buffer().numel() * bucket.buffer().element_size() / 2**20

        def record(fut):
            events.append(
                {
                    "bucket": bucket.index(),
                    "tensors": len(bucket.parameters()),
                    "mb": size_mb,
                    "layers": layers,
                    "start": start,
                    "end": time.perf_counter(),
                }
            )
            return fut.value()

        return future.then(record)

    timelines = {}
    for cap in [None, 25, 1]:  # None: bucket_cap_mb left unset, DDP's default
        model = make_model(seed=0, device=device)
        names = {id(p): n for n, p in model.named_parameters()}
        ddp_model = DDP(model) if cap is None else DDP(model, bucket_cap_mb=cap)
        ddp_model.register_comm_hook(None, timing_hook)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
        counts = []  # buckets after each backward(); DDP rebuilds them at the start of step 2
        for _ in range(4):  # time the last step, long after the rebuild
            events.clear()
            loss = nn.functional.mse_loss(ddp_model(x), y)
            sync(device)
            t0 = time.perf_counter()
            loss.backward()
            sync(device)
            t_end = time.perf_counter()
            counts.append(len(ddp_model.reducer._get_zeros_like_grad_buckets()))  # private, but exact
            optimizer.step()
            optimizer.zero_grad()
        events.sort(key=lambda e: e["start"])
        label = "unset" if cap is None else str(cap)
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
        timelines[label] = {
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
    main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
