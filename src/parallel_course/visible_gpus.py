"""GPUs for the nodes a notebook emulates on one machine, taken from the GPUs this process may use.

Chapters 04 and 10 start two "nodes" on one machine, each with ``CUDA_VISIBLE_DEVICES`` set to GPUs
of its own, as a cluster's nodes have. The GPUs must come from the list the kernel inherited: on a
shared node (a JupyterHub slice, a SLURM job without device cgroups) the variable names this
user's GPUs, by index or by UUID (``GPU-8f6e...``, ``MIG-...``), and index 0 may be someone
else's. An unset variable means every GPU of the machine; an empty one, none.
"""

import os


def visible_entries(inherited: str | None, count: int) -> list[str]:
    """The entries of an inherited CUDA_VISIBLE_DEVICES that name the ``count`` GPUs CUDA shows
    (``torch.cuda.device_count()``): indices or UUIDs, as given; for an unset variable, 0 .. count-1.
    CUDA reads the list up to its first invalid entry, so only the first ``count`` are GPUs."""
    if inherited is None:
        return [str(k) for k in range(count)]
    entries = [entry.strip() for entry in inherited.split(",")]
    return [entry for entry in entries if entry][:count]


def split_gpus(nodes: int, per_node: int, inherited: str | None, count: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each of ``nodes`` emulated nodes: ``per_node`` of the visible GPUs
    each, in order; all "" (no GPU: gloo on the CPU) when there are too few for every node."""
    entries = visible_entries(inherited, count)
    if len(entries) < nodes * per_node:
        return [""] * nodes
    return [",".join(entries[node * per_node : (node + 1) * per_node]) for node in range(nodes)]


def emulated_node_gpus(nodes: int, per_node: int) -> list[str]:
    """``split_gpus`` for this process: its CUDA_VISIBLE_DEVICES and the GPUs torch counts."""
    import torch

    # device_count() counts without making a CUDA context in this process (the kernel's).
    return split_gpus(nodes, per_node, os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())
