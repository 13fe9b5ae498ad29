"""What differs between the torch releases a GPU node may have (2.11, 2.12, 2.13), in one place: the
course is written against torch 2.13, but a GPU node's torch often comes from the cluster's modules.
Each fact has one helper here, so that a script or a counter never names an API its torch lacks.

Where a 2.13 feature is incidental (a measurement, a counter, a renamed argument), a script uses
what this torch has and says so in one line (``note``); where the lesson is the feature, it refuses
in one line that names the version (``refusal``). Features are found by looking (a keyword, an
attribute), not by comparing versions, where torch lets one look; the version is for the message.

- The single-tensor all-gather and reduce-scatter. torch 2.13 calls them ``all_gather_single`` and
  ``reduce_scatter_single`` (the names FSDP2 calls); before 2.13 they exist only as
  ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, which 2.13 keeps as deprecated aliases (a
  ``FutureWarning`` on every call; pytorch/pytorch#186123 renamed them). ``present_names`` says which
  a torch has, newest first; ``all_gather_single`` and ``reduce_scatter_single`` here call the newest,
  looked up at each call (so that a counter that wraps ``torch.distributed``'s attribute sees the call).
- A process group's timeout, changed after the group was created (``set_collective_timeout``): join
  with a generous timeout, then give the collectives a short one. torch 2.11-2.13 have it only as
  the private ``distributed_c10d._set_pg_timeout`` (what ``torch.distributed.breakpoint`` uses);
  where torch offers a public ``torch.distributed.set_timeout`` (pytorch/pytorch#187387), that is used.
- DDP's keyword for broadcasting rank 0's buffers before every forward (``ddp_buffer_sync``).
"""

from __future__ import annotations

import inspect
import re
from datetime import timedelta

import torch
import torch.distributed as dist

# The version the course is written and its outputs stored with (pyproject.toml pins it).
COURSE_TORCH = "2.13"


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: '2.12.1+cu130' -> (2, 12); '2.13.0a0+git1234' -> (2, 13)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def at_least(minimum: str, version: str | None = None) -> bool:
    """Whether torch (or ``version``) is ``minimum`` ('2.13') or newer."""
    return version_tuple(version or torch.__version__) >= version_tuple(minimum)


def refusal(what: str, minimum: str = COURSE_TORCH, version: str | None = None) -> str | None:
    """The one line in which a feature that needs torch ``minimum`` refuses on an older torch, or None."""
    version = version or torch.__version__
    if at_least(minimum, version):
        return None
    return f"{what} needs torch {minimum} or newer; this is torch {version}"


def note(what: str, instead: str, since: str = COURSE_TORCH, version: str | None = None) -> str:
    """The one line a script prints where it uses an older torch's way: what is missing, and what it does."""
    return f"note: torch {version or torch.__version__} has no {what} (torch {since}): {instead}"


def accepts_keyword(function, name: str) -> bool:
    """Whether ``function`` (or a class's constructor) takes the keyword argument ``name``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def ddp_buffer_sync(sync: bool, ddp_class=None) -> tuple[dict, str | None]:
    """DDP's keyword for broadcasting rank 0's buffers before every forward, and a note if it is not
    torch 2.13's. ``forward_sync_buffers`` arrived in 2.13; before, ``broadcast_buffers``, which with
    False also skips the broadcast at construction (forward_sync_buffers=False still makes it)."""
    if ddp_class is None:
        from torch.nn.parallel import DistributedDataParallel as ddp_class
    # DDP's own signature: a **kwargs would say nothing about this keyword.
    if "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters:
        return {"forward_sync_buffers": sync}, None
    return {"broadcast_buffers": sync}, note(
        "DDP(forward_sync_buffers=)",
        "broadcast_buffers= instead, which with False also skips the broadcast at construction",
    )


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
