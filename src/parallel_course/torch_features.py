"""Which torch this is, and what it has: the course is written against torch 2.13, but a GPU node's
torch often comes from the cluster's modules (2.11, 2.12).

Where a 2.13 feature is incidental (a measurement, a counter, a renamed argument), a script uses
what this torch has and says so in one line (``note``); where the lesson is the feature, it refuses
in one line that names the version (``refusal``). Features are found by looking (a keyword, an
attribute), not by comparing versions, where torch lets one look; the version is for the message.
"""

import inspect
import re

import torch

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


def reduce_scatter_name(dist_module=None) -> str:
    """The name of the single-tensor reduce-scatter that FSDP2 calls: ``reduce_scatter_single`` since
    torch 2.13, ``reduce_scatter_tensor`` before (2.13 keeps it, deprecated)."""
    if dist_module is None:
        import torch.distributed as dist_module
    return "reduce_scatter_single" if hasattr(dist_module, "reduce_scatter_single") else "reduce_scatter_tensor"
