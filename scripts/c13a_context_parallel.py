"""Chapter 13a: context parallelism by hand, checked against attention on the whole sequence, in one launch.

    torchrun --standalone --nproc_per_node=4 c13a_context_parallel.py --out work/context_parallel.json

Every rank draws the same q, k and v for the whole sequence and keeps its share of the positions.
Ring attention with a contiguous split, ring attention with a zig-zag split and Ulysses each
compute their share; rank 0 gathers the outputs and the gradients of q, k and v and compares them
with F.scaled_dot_product_attention(is_causal=True) on the whole sequence. The negative control is
the zig-zag ring folding its blocks in without the log-sum-exp rescale. While each runs forward,
this script counts the query-key pairs each rank computes and the bytes it sends, and, for the
ring, the bytes of keys and values autograd keeps for backward; rank 0 prints the checks and a
table, and writes the counts as JSON.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_setup import setup, teardown
from parallel_course import context_parallel as cp
from parallel_course.checks import CheckFailed, check_close, check_equal
from parallel_course.flash_attention import SavedTensors

WORLD_SIZE = 4
TOLERANCE = 1e-5


class Counted:
    """While open, counts what this rank computes and sends: query-key pairs (all heads, one
    sequence) in ring blocks and in SDPA, and the bytes of its sends and of the all-to-all pieces
    that leave it. Wraps the functions context_parallel calls, and puts them back on exit."""

    def __init__(self):
        self.pairs = self.bytes_sent = self.messages = 0

    def __enter__(self):
        self.originals = (
            cp.block_attention,
            dist.batch_isend_irecv,
            dist.all_to_all_single,
            F.scaled_dot_product_attention,
        )
        block_attention, batch_isend_irecv, all_to_all_single, sdpa = self.originals

        def counted_block(q, k, v, *, mask):
            n, m = q.shape[-2], k.shape[-2]
            self.pairs += q.shape[1] * (n * (n + 1) // 2 if mask == "causal" else n * m)
            return block_attention(q, k, v, mask=mask)

        def counted_p2p(ops):
            sends = [op.tensor for op in ops if op.op is dist.isend]
            self.bytes_sent += sum(t.numel() * t.element_size() for t in sends)
            self.messages += len(sends)
            return batch_isend_irecv(ops)

        def counted_all_to_all(output, input, *args, **kwargs):
            world_size = dist.get_world_size(kwargs.get("group"))
            self.bytes_sent += input.numel() * input.element_size() * (world_size - 1) // world_size
            self.messages += world_size - 1
            return all_to_all_single(output, input, *args, **kwargs)

        def counted_sdpa(q, k, v, is_causal=False, **kwargs):
            n = q.shape[-2]
            self.pairs += q.shape[1] * (n * (n + 1) // 2 if is_causal else n * k.shape[-2])
            return sdpa(q, k, v, is_causal=is_causal, **kwargs)

        cp.block_attention, dist.batch_isend_irecv = counted_block, counted_p2p
        dist.all_to_all_single, F.scaled_dot_product_attention = counted_all_to_all, counted_sdpa
        return self

    def __exit__(self, *exc):
        cp.block_attention, dist.batch_isend_irecv, dist.all_to_all_single, F.scaled_dot_product_attention = (
            self.originals
        )


class KeptKeysValues(SavedTensors):
    """While open, the bytes of keys and values that autograd saves for backward: the storages of
    saved tensors that are (views of) a ring step's stack of K and V, shape (2, *local), the stack
    ring_attention passes around. Each is kept whole as long as any block of it is saved."""

    def __init__(self, local: torch.Tensor):
        super().__init__()
        self.shape = (2, *local.shape)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if tuple(base.shape) == self.shape:
            super().pack(base)
        return t


def blocks_used(rank: int, world_size: int, layout: str) -> int:
    """How many ranks' key/value blocks rank's ring attention computes with (the others are all
    masked): the blocks autograd keeps for its backward."""
    mine = cp.chunks_of(rank, world_size, layout)
    return sum(
        any(cp.mask_kind(q, k) != "skip" for q in mine for k in cp.chunks_of(source, world_size, layout))
        for source in range(world_size)
    )


def gathered(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The whole sequence from every rank's share of it (rank order), on every rank."""
    shares = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(shares, t.contiguous())
    return cp.unsplit_sequence(shares, layout)


def run(attention, layout: str, q, k, v, weight) -> dict:
    """One context-parallel attention on this rank's share: its whole output and gradients
    (gathered), what this rank computed and sent in forward, and the ring's keys and values kept
    for backward."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [cp.split_sequence(t, rank, world_size, layout).requires_grad_() for t in (q, k, v)]
    with Counted() as counted, KeptKeysValues(mine[1]) as kept:
        out = attention(*mine)
    (out * cp.split_sequence(weight, rank, world_size, layout)).sum().backward()
    # On the device: nccl gathers only GPU tensors.
    counts = torch.tensor([counted.pairs, counted.bytes_sent, counted.messages, kept.bytes], device=out.device)
    every = [torch.empty_like(counts) for _ in range(world_size)]
    dist.all_gather(every, counts)
    return {
        "out": gathered(out.detach(), layout),
        "grads": torch.cat([gathered(t.grad, layout) for t in mine]),
        "pairs": [int(c[0]) for c in every],
        "bytes": [int(c[1]) for c in every],
        "messages": [int(c[2]) for c in every],
        "kv_kept": [int(c[3]) for c in every],
        "local": mine[0].detach(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="Ring attention and Ulysses checked against SDPA, on 4 processes.")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8, help="a multiple of 4 (Ulysses gives each rank whole heads)")
    parser.add_argument("--seq-len", type=int, default=32, help="a multiple of 8 (2 chunks per rank)")
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the JSON file rank 0 writes")
    args = parser.parse_args()
    # Checked before the group is joined: a bad request is one line, before anything starts.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != WORLD_SIZE or args.seq_len % (2 * WORLD_SIZE) or args.heads % WORLD_SIZE:
        parser.error(
            f"runs on {WORLD_SIZE} processes (torchrun --nproc_per_node={WORLD_SIZE}), "
            f"--seq-len a multiple of {2 * WORLD_SIZE}, --heads a multiple of {WORLD_SIZE}"
        )
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Every rank draws the same whole-sequence tensors; each keeps its positions.
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    q, k, v, weight = (torch.randn(shape, generator=g).to(device) for _ in range(4))

    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*whole, is_causal=True)
    (expected * weight).sum().backward()
    expected_grads = torch.cat([t.grad for t in whole])

    runs = {
        "ring, contiguous": run(lambda *t: cp.ring_attention(*t, layout="contiguous"), "contiguous", q, k, v, weight),
        "ring, zig-zag": run(lambda *t: cp.ring_attention(*t, layout="zigzag"), "zigzag", q, k, v, weight),
        "Ulysses": run(cp.ulysses_attention, "contiguous", q, k, v, weight),
    }
    no_rescale = run(lambda *t: cp.ring_attention(*t, layout="zigzag", rescale=False), "zigzag", q, k, v, weight)
    # Ulysses gives each rank whole heads: a head count the ranks do not divide is refused.
    try:
        cp.sequence_to_heads(torch.zeros(args.batch, 6, args.seq_len // world_size, args.head_dim))
        refused = "not refused"
    except ValueError as error:
        refused = str(error)

    if rank == 0:
        print(f"q, k, v: {tuple(shape)} (batch, heads, positions, head_dim), float32, {world_size} ranks")
        for name, result in runs.items():
            check_close(f"{name}: output == SDPA on the whole sequence", result["out"], expected, TOLERANCE)
            check_close(f"{name}: gradients of q, k, v == SDPA's", result["grads"], expected_grads, TOLERANCE)
        try:
            check_close("ring, zig-zag, no rescale: output == SDPA", no_rescale["out"], expected, TOLERANCE)
            print("the negative control passed: the check cannot tell a wrong merge")
            return 1
        except CheckFailed as failed:
            print(f"negative control: {failed}")
        local = runs["ring, zig-zag"]["local"]
        for name, layout in (("ring, contiguous", "contiguous"), ("ring, zig-zag", "zigzag")):
            formula = [p * args.heads for p in cp.pairs_per_rank(args.seq_len, world_size, layout)]
            check_equal(f"{name}: pairs counted == pairs_per_rank", runs[name]["pairs"], formula)
        check_equal("ring: bytes sent == ring_kv_bytes", runs["ring, zig-zag"]["bytes"][0], cp.ring_kv_bytes(local, 4))
        check_equal("Ulysses: bytes sent == ulysses_bytes", runs["Ulysses"]["bytes"][0], cp.ulysses_bytes(local, 4))
        # This ring keeps, for backward, every key/value block it used: not its share, all of them.
        share = 2 * local.numel() * local.element_size()
        for name, layout in (("ring, contiguous", "contiguous"), ("ring, zig-zag", "zigzag")):
            formula = [blocks_used(r, world_size, layout) * share for r in range(world_size)]
            check_equal(f"{name}: K, V kept for backward == blocks used x share", runs[name]["kv_kept"], formula)
        kept = runs["ring, zig-zag"]["kv_kept"]
        print(
            f"ring, zig-zag: every rank keeps {kept[0]:,} bytes of K and V until backward, {kept[0] // share} times "
            f"its share of {share:,}: the whole sequence's"
        )
        print(f"Ulysses with 6 heads on {world_size} ranks: ValueError: {refused}")
        header = f"{'per rank (forward)':<18} {'query-key pairs, all heads':<28} {'max/min':>7}"
        print(f"{header} {'messages':>8} {'bytes sent':>10}")
        for name, result in runs.items():
            pairs = result["pairs"]
            row = f"{name:<18} {str(pairs):<28} {max(pairs) / min(pairs):>7.2f} {result['messages'][0]:>8}"
            print(f"{row} {result['bytes'][0]:>10,}")
        summary = {
            "shape": list(shape),
            "world_size": world_size,
            "tolerance": TOLERANCE,
            **{
                name: {key: result[key] for key in ("pairs", "bytes", "messages", "kv_kept")}
                for name, result in runs.items()
            },
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
        sys.stdout.write(f"wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
