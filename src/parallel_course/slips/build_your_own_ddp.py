"""Lab 05 (build your own DDP): the likely slips, recognised from what the wrapper made of the weights
and of each step's gradients.

- ``broadcast_slip``: after wrapping, a rank's parameters or buffers are still its own, not rank 0's
  (nothing broadcast, or the parameters only, or into copies);
- ``gradient_slip``: the first step whose gradients (once synchronized) are not the whole batch's:
  N times them (summed over the ranks, never divided), 1/N of them (divided twice), or this rank's
  own gradients (the averages never reach ``.grad``);
- ``AllReduces``: what a wrapper's all-reduces did in each step, in order with the gradients
  autograd produced: how many, how many elements each, asynchronous or not, started while
  backward still had gradients to compute (before its last one), waited for before the update;
  ``communication_slip`` reads them: no all-reduce started during backward (no hooks, no overlap),
  blocking ones, ones never waited for, one flat bucket where there should be buckets, a step that
  starts none (the per-step state not reset).

Orders and sizes, counted: never a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn

from parallel_course.checks import scale_of

# Two gradients agree when they differ by at most this, relative to the larger one's largest element.
RTOL = 1e-4


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape != b.shape or not torch.equal(a.detach().cpu(), b.detach().cpu())


def broadcast_slip(model: nn.Module, rank0: nn.Module) -> str | None:
    """Whether ``model``, just wrapped, holds the parameters and buffers of ``rank0`` (a model built
    with rank 0's initialisation): the slip when it does not, else None."""
    theirs = dict(rank0.named_parameters()) | dict(rank0.named_buffers())
    params = [n for n, p in model.named_parameters() if n in theirs and _differ(p, theirs[n])]
    buffers = [n for n, b in model.named_buffers() if n in theirs and _differ(b, theirs[n])]
    if params and buffers:
        return (
            "after wrapping, this rank's parameters and buffers are its own, not rank 0's: does the constructor "
            "broadcast them, in place?"
        )
    if params:
        return (
            f"after wrapping, this rank's parameters (e.g. {params[0]}) are its own, not rank 0's, its buffers "
            "rank 0's: are the parameters broadcast, in place?"
        )
    if buffers:
        return (
            f"after wrapping, this rank's buffer {buffers[0]} is its own, not rank 0's: are the buffers broadcast too?"
        )
    return None


def _same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    if got.keys() != expected.keys():
        return False
    for name, e in expected.items():
        g = got[name].detach().double().cpu()
        e = e.detach().double().cpu()
        largest = max(g.abs().max().item(), e.abs().max().item(), 1e-12)
        if g.shape != e.shape or not (g - e).abs().max().item() <= RTOL * largest:
            return False
    return True


def gradient_slip(
    synced: Sequence[dict[str, torch.Tensor]],
    expected: Sequence[dict[str, torch.Tensor]],
    own: Sequence[dict[str, torch.Tensor]],
    world_size: int,
) -> str | None:
    """The slip behind the first step whose synchronized gradients (``synced[k]``, by parameter name)
    are not the whole batch's (``expected[k]``); ``own[k]``: this rank's gradients of its shard alone.
    None when every step agrees, or no slip fits."""
    for k, (got, want, alone) in enumerate(zip(synced, expected, own)):
        if _same(got, want):
            continue
        step = f"step {k + 1}"
        names = sorted(want)
        if got.keys() == want.keys():
            scale = scale_of([got[n] for n in names], [want[n] for n in names], rtol=RTOL)
            if scale is not None and abs(scale - world_size) <= 1e-3 * world_size:
                return (
                    f"every gradient of {step} is {scale:.2f}x the reference's: is the sum over the ranks "
                    "divided by the world size?"
                )
            if scale is not None and abs(scale * world_size - 1) <= 1e-3:
                return (
                    f"every gradient of {step} is {scale:.2f}x the reference's: is the average divided by the "
                    "world size once more?"
                )
        if _same(got, alone):
            return (
                f"every gradient of {step} is this rank's own, of its shard alone: do the all-reduced values "
                "reach .grad?"
            )
        return None
    return None


# --- the all-reduces of each step ---------------------------------------------------------------


@dataclass
class AllReduce:
    """One all-reduce a wrapper started: its elements, whether it returned at once (async_op=True),
    whether it started before backward's last gradient, whether it was waited for before the update."""

    numel: int
    asynchronous: bool
    early: bool = False
    waited: bool = False


class _Waited:
    """The work an asynchronous all-reduce returns, noting when it is waited for."""

    def __init__(self, work, record: AllReduce):
        self._work, self._record = work, record

    def wait(self, *args, **kwargs):
        self._record.waited = True
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        self._record.waited = True
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


class AllReduces:
    """The all-reduces a wrapped model starts, step by step. Built on the model *before* it is wrapped:
    its hooks then run before the wrapper's, so that a gradient is noted as produced before the
    all-reduce its own hook starts. ``modules``: the student's modules (a name bound there to
    ``dist.all_reduce`` is counted too)."""

    def __init__(self, model: nn.Module, modules: Sequence = ()):
        self.modules, self.steps, self._events = list(modules), [], []
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(lambda p: self._events.append("gradient"))

    @contextlib.contextmanager
    def step(self):
        """Counts the all-reduces started while the block runs: one step, up to ``synced()``."""
        self._events = []
        original = dist.all_reduce

        def all_reduce(tensor, *args, **kwargs):
            asynchronous = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
            record = AllReduce(tensor.numel(), asynchronous, waited=not asynchronous)
            self._events.append(record)
            work = original(tensor, *args, **kwargs)
            return _Waited(work, record) if asynchronous else work

        places = [dist, c10d] + [m for m in self.modules if getattr(m, "all_reduce", None) is original]
        for place in places:
            place.all_reduce = all_reduce
        try:
            yield
        finally:
            for place in places:
                place.all_reduce = original

    def synced(self) -> None:
        """Once the gradients are synchronized (before the update): this step's all-reduces, as they stand."""
        last = max((i for i, e in enumerate(self._events) if e == "gradient"), default=-1)
        records = []
        for i, event in enumerate(self._events):
            if isinstance(event, AllReduce):
                records.append(AllReduce(event.numel, event.asynchronous, i < last, event.waited))
        self.steps.append(records)


def summary(records: Sequence[AllReduce]) -> str:
    """A step's all-reduces in a few words."""
    if not records:
        return "no all-reduce"
    early = sum(r.early for r in records)
    blocking = sum(not r.asynchronous for r in records)
    unwaited = sum(not r.waited for r in records)
    parts = [
        f"{len(records)} all-reduce(s) of {sum(r.numel for r in records):,} elements",
        f"{early} started while backward ran",
    ]
    parts += [f"{blocking} blocking"] if blocking else []
    parts += [f"{unwaited} never waited for"] if unwaited else []
    return ", ".join(parts)


def communication_slip(
    bucketed: bool, steps: Sequence[Sequence[AllReduce]], tensors: int, numel: int, most: int
) -> str | None:
    """What a wrapper's all-reduces (``steps``, from ``AllReduces``) get wrong, or None. ``tensors``,
    ``numel``: the model's trainable tensors and elements; ``most``: the elements a bucket may hold
    (bucket_size_mb, or the largest tensor where that is larger)."""
    first = steps[0]
    for k, records in enumerate(steps[1:], start=2):
        if first and not records:
            return (
                f"step {k} starts no all-reduce, step 1 started {len(first)}: is the per-step state (the gradients "
                "counted per bucket, the pending all-reduces) reset in on_train_batch_start()?"
            )
    if not first:
        return "no all-reduce of the gradients: does a hook on each parameter start them?"
    blocking = sum(not r.asynchronous for r in first)
    if blocking:
        return (
            f"{blocking} blocking all-reduce(s): backward stops at each until it is done; pass async_op=True, and "
            "wait in finish_gradient_synchronization()"
        )
    for k, records in enumerate(steps, start=1):
        unwaited = sum(not r.waited for r in records)
        if unwaited:
            return (
                f"{unwaited} of step {k}'s {len(records)} all-reduce(s) never waited for before the update: "
                "finish_gradient_synchronization() must wait() for every one (until then the gradient may not hold "
                "the sum)"
            )
    if bucketed and len(first) < 2:
        return "one flat all-reduce of every gradient: are the gradients cut into buckets of bucket_size_mb?"
    if not any(r.early for r in first):
        start = "a bucket's all-reduce as soon as its last gradient" if bucketed else "each one as soon as its gradient"
        return (
            "none started while backward still had gradients to compute: the overlap is the point; does a hook "
            f"(register_post_accumulate_grad_hook) start {start} is ready?"
        )
    if bucketed:
        over = max(r.numel for r in first)
        if over > most:
            return (
                f"a bucket of {over:,} elements, more than bucket_size_mb holds ({most:,}): when does a bucket close?"
            )
        if sum(r.numel for r in first) != numel:
            return (
                f"the buckets hold {sum(r.numel for r in first):,} elements, the trainable gradients {numel:,}: is "
                "every gradient in exactly one bucket?"
            )
    elif len(first) != tensors:
        return (
            f"{len(first)} all-reduce(s) per step: DDP all-reduces each of the {tensors} trainable tensors on its own"
        )
    return None
