"""Chapter 16: the capstone's memory on 2 processes (or 4), in one launch.

    torchrun --standalone --nproc_per_node=2 c16_memory.py --out work/memory.json

Three parts, each checked against one process that every rank computes for itself (the whole model
on the whole batch), with a negative control:

- ring-flash: the capstone's GPT with its sequence split over the ranks, zig-zag, every block's
  attention ``ring_flash_attention`` (as ``apply_cp`` makes it over its 2 ranks): the loss and the
  global gradient norm (gradients summed over the ranks) of one step equal one process's. Negative
  control: the ring whose keys' and values' gradients miss their last hop home.
- loss_parallel: the GPT's head split by vocabulary (ColwiseParallel, its logits left sharded),
  the loss computed under ``torch.distributed.tensor.parallel.loss_parallel``: its loss and
  gradient norm equal one process's, and each rank holds its share of the logits; the same loss by
  hand (``vocab_parallel_cross_entropy``). Negative control: by hand, each rank's softmax normalised
  over its own share of the vocabulary.
- torch's memory trackers (``MemTracker``, ``FSDPMemTracker``) on the capstone's layouts ddp, fsdp,
  tp and cp (cp's row of the table runs on 2 processes only), two steps each, the tracker reset
  between steps (``memory_tracking.track_layout``).

Rank 0 prints the checks and writes every figure as JSON for the notebook.
"""

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

from dist_setup import setup, teardown
from parallel_course.checks import CheckFailed, check_close
from parallel_course.context_parallel import positions_of, ring_attention, ring_flash_attention, split_sequence
from parallel_course.flash_attention import SavedTensors
from parallel_course.gpt import GPT, IGNORE, AdditionTask, GPTConfig, answer_loss_sum
from parallel_course.loss_memory import vocab_parallel_cross_entropy
from parallel_course.memory_tracking import track_layout
from parallel_course.training.layouts import LAYOUTS
from parallel_course.training.parallelize import CP_LAYOUT

WORLD_SIZES = (2, 4)
TRACKED = ("ddp", "fsdp", "tp", "cp")


def gradient_norm(model) -> torch.Tensor:
    """The global norm of the gradients, a DTensor's taken whole (sqrt of the sum of squares)."""
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return torch.sqrt(sum(g.double().square().sum() for g in grads))


def one_process(x, y, device, seed: int):
    """The reference: the whole model on the whole batch, on this rank alone. Returns the mean loss
    over the answer tokens and the gradient norm."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig()).to(device)
    loss_sum, count = answer_loss_sum(model(x), y)
    (loss_sum / count).backward()
    return (loss_sum / count).detach(), gradient_norm(model)


def context_parallel_step(x, y, device, seed: int, gradients_home: bool = True):
    """One step of the GPT with its sequence split over every rank, zig-zag, its attention ring-flash
    (the ring's gradients sent home or not): the mean loss and the gradient norm, the gradients summed
    over the ranks (each saw other positions), as DDP over the cp ranks averages them."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = GPT(GPTConfig()).to(device)
    ring = functools.partial(ring_flash_attention, layout=CP_LAYOUT, gradients_home=gradients_home)
    for block in model.blocks:
        block.attn.attention = ring
    positions = positions_of(rank, world_size, x.shape[1], CP_LAYOUT).to(device)
    count = (y != IGNORE).sum()
    loss_sum, _ = answer_loss_sum(model(x[:, positions], positions), y[:, positions])
    (loss_sum / count).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    total = loss_sum.detach().clone()
    dist.all_reduce(total)
    return total / count, gradient_norm(model)


def loss_parallel_step(x, y, device, seed: int):
    """One step with the head split by vocabulary over every rank and its logits left sharded, the loss
    under loss_parallel. Returns the mean loss, the gradient norm, the bytes of this rank's logits,
    and the loss by hand with and without the normaliser's all-reduce."""
    mesh = LAYOUTS["tp"].meshes(device.type, dist.get_world_size())["tp"]
    torch.manual_seed(seed)
    model = GPT(GPTConfig()).to(device)
    parallelize_module(model, mesh, {"head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    logits = model(x)
    count = (y != IGNORE).sum()
    with loss_parallel():
        loss_sum = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
        (loss_sum / count).backward()
    local = logits.to_local().detach()
    start = mesh.get_local_rank() * local.shape[-1]
    by_hand = [
        vocab_parallel_cross_entropy(local.flatten(0, 1), y.flatten(), start, mesh.get_group(), reduce_normalizer=r)
        / count
        for r in (True, False)
    ]
    figures = {"local_logits_shape": list(local.shape), "local_logits_bytes": local.numel() * local.element_size()}
    # The loss is a DTensor (replicated on every rank): its value as a plain tensor.
    return (loss_sum / count).detach().full_tensor(), gradient_norm(model), by_hand, figures


def ring_memory(device, seed: int) -> dict:
    """Bytes one attention call saves for backward on this rank, beyond its own q, k, v: chapter
    13a's ring (autograd keeps every block it received, and each block pair's probabilities) and
    ring-flash (its output and log-sum-exp), for a sequence of 64 positions split zig-zag over every rank."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 64, 16, generator=g).to(device) for _ in range(3))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    saved = {}
    for name, attention in (("ring_attention", ring_attention), ("ring_flash_attention", ring_flash_attention)):
        mine = [split_sequence(t, rank, world_size, CP_LAYOUT).requires_grad_() for t in (q, k, v)]
        with SavedTensors(*mine) as kept:
            out = attention(*mine)
        out.sum().backward()
        saved[name] = kept.beyond_inputs
    share = mine[1].numel() * mine[1].element_size()
    return {"saved_beyond_qkv": saved, "kv_share_bytes": 2 * share}


def checks(device, seed: int) -> dict:
    """The ring-flash and loss_parallel checks of one step against one process (printed by rank 0)."""
    task = AdditionTask(2)
    x, y = (t.to(device) for t in task.batch(torch.Generator().manual_seed(seed + 1), 16))
    loss, norm = one_process(x, y, device, seed)
    cp_loss, cp_norm = context_parallel_step(x, y, device, seed)
    away_loss, away_norm = context_parallel_step(x, y, device, seed, gradients_home=False)
    lp_loss, lp_norm, (by_hand, unreduced), logits = loss_parallel_step(x, y, device, seed)
    rings = ring_memory(device, seed)
    result = {
        "rings": rings,
        "one_process": {"loss": loss.item(), "gradient_norm": norm.item()},
        "ring_flash": {"loss": cp_loss.item(), "gradient_norm": cp_norm.item()},
        "ring_flash_gradients_not_home": {"loss": away_loss.item(), "gradient_norm": away_norm.item()},
        "loss_parallel": {"loss": lp_loss.item(), "gradient_norm": lp_norm.item(), **logits},
        "by_hand": by_hand.item(),
        "by_hand_unreduced_normaliser": unreduced.item(),
    }
    if dist.get_rank() != 0:
        return result
    whole = x.shape[0] * x.shape[1] * GPTConfig().vocab_size * 4
    n = dist.get_world_size()
    print(f"one step, global batch {x.shape[0]}, against one process on the whole batch (relative differences)")
    for name, got in ((f"ring-flash, cp {n}", (cp_loss, cp_norm)), (f"loss_parallel, tp head {n}", (lp_loss, lp_norm))):
        relative = torch.stack([got[0] / loss, got[1] / norm]).double()
        check_close(f"{name}: loss and gradient norm", relative, torch.ones(2, dtype=torch.float64), 1e-5)
    check_close("vocabulary-parallel loss by hand == loss_parallel", by_hand, lp_loss, 1e-5)
    for name, got, expected in (
        ("ring-flash, the gradients' last hop home left out: gradient norm", away_norm / norm, 1.0),
        ("by hand, each rank's softmax over its own share of the vocabulary: loss", unreduced / lp_loss, 1.0),
    ):
        try:
            check_close(name, got.double(), torch.tensor(expected, dtype=torch.float64), 1e-5)
            print("the negative control passed: the check cannot tell the mistake")
        except CheckFailed as failed:
            print(f"negative control: {failed}")
    kept = rings["saved_beyond_qkv"]
    print(
        f"one attention, 64 positions over {n} ranks, saved for backward beyond a rank's own q, k, v: "
        f"ring_attention {kept['ring_attention']:,} bytes, ring_flash_attention {kept['ring_flash_attention']:,} "
        f"(its own K and V: {rings['kv_share_bytes']:,})"
    )
    print(
        f"logits per rank under loss_parallel: {logits['local_logits_shape']}, {logits['local_logits_bytes']:,} "
        f"bytes (gathered: {whole:,})"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description="The capstone's memory on 2 processes: ring-flash, loss_parallel, trackers"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the JSON file rank 0 writes")
    args = parser.parse_args()
    # Checked before the group is joined: a bad request is one line, before anything starts.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size not in WORLD_SIZES:
        parser.error(
            f"runs on 2 or 4 processes (torchrun --nproc_per_node=2): the capstone's 4 heads and 12-token "
            f"vocabulary split over them, and its 8 positions in 2 zig-zag chunks per rank; got {world_size}"
        )
    device = setup()
    result = checks(device, args.seed)
    # The layouts whose row of the table runs on this many processes (cp: 2 only).
    names = [name for name in TRACKED if LAYOUTS[name].refusal(world_size) is None]
    tracked = {name: track_layout(name, device, seed=args.seed) for name in names}
    # Every rank's peaks, in rank order.
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, tracked)
    if dist.get_rank() == 0:
        result["tracked"] = {name: [rank[name] for rank in every] for name in names}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        sys.stdout.write(f"tracked {', '.join(names)} on {world_size} ranks; wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
