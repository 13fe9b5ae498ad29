"""What differs between the torch releases a GPU node may have (2.11, 2.12, 2.13): one place that
picks what the running torch offers, so that a script or a counter never names an API its torch lacks.

- The single-tensor all-gather and reduce-scatter. torch 2.13 calls them ``all_gather_single`` and
  ``reduce_scatter_single``; before 2.13 they exist only as ``all_gather_into_tensor`` and
  ``reduce_scatter_tensor``, which 2.13 keeps as deprecated aliases (a ``FutureWarning`` on every
  call; pytorch/pytorch#186123 renamed them). ``all_gather_single`` and ``reduce_scatter_single``
  here call whichever name the running torch has, looked up at each call (so that a counter that
  wraps ``torch.distributed``'s attribute sees the call).
- A process group's timeout, changed after the group was created (``set_collective_timeout``): join
  with a generous timeout, then give the collectives a short one. torch 2.11-2.13 have it only as
  the private ``distributed_c10d._set_pg_timeout`` (what ``torch.distributed.breakpoint`` uses);
  where torch offers a public ``torch.distributed.set_timeout`` (pytorch/pytorch#187387), that is used.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

# Each single-tensor collective by its torch 2.13 name, then the name torch had before 2.13.
NAMES = {
    "all_gather_single": ("all_gather_single", "all_gather_into_tensor"),
    "reduce_scatter_single": ("reduce_scatter_single", "reduce_scatter_tensor"),
}


def present_names(canonical: str) -> tuple[str, ...]:
    """The names of a collective that the running ``torch.distributed`` has, newest first."""
    found = tuple(name for name in NAMES[canonical] if hasattr(dist, name))
    if not found:
        raise AttributeError(f"torch.distributed has none of {NAMES[canonical]} (torch {torch.__version__})")
    return found


def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    """``dist.all_gather_single`` (torch 2.13), or ``dist.all_gather_into_tensor`` before it."""
    gather = getattr(dist, present_names("all_gather_single")[0])
    return gather(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """``dist.reduce_scatter_single`` (torch 2.13), or ``dist.reduce_scatter_tensor`` before it."""
    reduce_scatter = getattr(dist, present_names("reduce_scatter_single")[0])
    return reduce_scatter(output=output, input=input, op=op, group=group, async_op=async_op)


def set_collective_timeout(seconds: float, group=None) -> None:
    """From now on, a collective of ``group`` (default: the default group) that waits longer than
    ``seconds`` fails: on gloo it raises, on nccl the watchdog ends the process."""
    timeout = timedelta(seconds=seconds)
    public = getattr(dist, "set_timeout", None)
    if public is not None:
        public(timeout, group)
    else:
        dist.distributed_c10d._set_pg_timeout(timeout, group)
