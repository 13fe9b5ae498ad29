"""Data sets and timers for feeding a training step (chapter 11b).

The data sets live here, not in the notebook, because DataLoader workers started by *spawn* (the
default on macOS and Windows) import the data set's class by name: a class defined in a notebook
cell cannot be found there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from torch.utils.data import Dataset, get_worker_info


class SlowStorage(Dataset):
    """Samples that each take ``read_seconds`` to arrive, as from a network file system or an object
    store: the wait is a sleep, so it costs no CPU, like real I/O. The sample itself is cheap and
    depends only on its index."""

    def __init__(self, size: int, features: int, read_seconds: float):
        self.size, self.features, self.read_seconds = size, features, read_seconds

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_seconds)
        g = torch.Generator().manual_seed(index)
        x = torch.randn(self.features, generator=g)
        return x, x.sum(0, keepdim=True)


class NoisyCopies(Dataset):
    """Sample ``index`` is ``index`` plus random noise (an augmentation) drawn from the process's
    global random generator, as ``torch.rand`` in a transform does. Returns the index, the noise,
    and the DataLoader worker that drew it (-1 in the main process)."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, float, int]:
        info = get_worker_info()
        return index, torch.rand(()).item(), -1 if info is None else info.id


class SeededNoisyCopies(NoisyCopies):
    """The same, but the noise of sample ``index`` in ``epoch`` comes from a generator seeded by
    ``(seed, epoch, index)``: it no longer depends on which process or worker draws it, nor on
    how many there are."""

    def __init__(self, size: int, seed: int):
        super().__init__(size)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int) -> tuple[int, float, int]:
        _, _, worker = super().__getitem__(index)
        # Distinct for every (seed, epoch, index) with epoch and index below a million.
        g = torch.Generator().manual_seed((self.seed * 1_000_000 + self.epoch) * 1_000_000 + index)
        return index, torch.rand((), generator=g).item(), worker


def timed_steps(batches: Iterable, step: Callable, steps: int) -> dict[str, float]:
    """Run ``step(batch)`` on the first ``steps`` batches after a warm-up batch (the first one
    also pays for starting workers) and time, separately, the waits for the next batch and the
    steps. Returns seconds per step: ``wait``, ``compute``, ``total``, and ``wait_share``; and
    ``compute_cpu``, the CPU time the calling thread spent in the steps (what a step needs: a busy
    machine lengthens its wall time only); and ``per_step``, each step's (wait, compute) in order."""
    it = iter(batches)
    step(next(it))
    wait = compute = cpu = 0.0
    per_step = []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        t1, c1 = time.perf_counter(), time.thread_time()
        step(batch)
        t2, c2 = time.perf_counter(), time.thread_time()
        wait, compute, cpu = wait + t1 - t0, compute + t2 - t1, cpu + c2 - c1
        per_step.append((t1 - t0, t2 - t1))
    total = wait + compute
    return {
        "wait": wait / steps,
        "compute": compute / steps,
        "total": total / steps,
        "wait_share": wait / total,
        "compute_cpu": cpu / steps,
        "per_step": per_step,
    }


def host_to_device_seconds(numel: int, pinned: bool, device: str = "cuda", repeats: int = 20) -> dict[str, float]:
    """Median seconds to copy ``numel`` float32 values from host memory (pinned or pageable) to
    ``device``: ``blocked``, how long the calling thread waits in ``.to(device, non_blocking=True)``,
    and ``copy``, until the copy has finished (the device synchronised). Needs an accelerator."""
    host = torch.randn(numel)
    host = host.pin_memory() if pinned else host
    blocked, copy = [], []
    for _ in range(repeats + 1):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        host.to(device, non_blocking=True)
        t1 = time.perf_counter()
        torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        blocked.append(t1 - t0)
        copy.append(t2 - t0)
    return {"blocked": sorted(blocked[1:])[repeats // 2], "copy": sorted(copy[1:])[repeats // 2]}
