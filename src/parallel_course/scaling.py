"""What data parallelism buys, from the numbers ``scripts/bench_scaling.py`` measures (chapter 06b).

- strong scaling at a fixed global batch: ``speedup = throughput_N / throughput_1``,
  ``efficiency = speedup / N`` (``bench_scaling.py`` times one process on the whole batch
  alternately with each configuration, so both see the same machine load);
- ``overlap = (t_compute + t_comm − t_step) / t_comm``: the share of the communication hidden
  behind computation (1: all of it, 0: none, < 0: the step is slower than computing and then
  communicating one after the other: the two slow each other down).
"""

from __future__ import annotations


def speedup(throughput: float, baseline: float) -> float:
    """Throughput (samples/s) relative to one process's."""
    if not baseline > 0:
        raise ValueError(f"baseline throughput must be positive, got {baseline}")
    return throughput / baseline


def efficiency(throughput: float, baseline: float, world_size: int) -> float:
    """Scaling efficiency: speedup / N (1.0 = perfect linear scaling)."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return speedup(throughput, baseline) / world_size


def overlap_fraction(t_compute: float, t_comm: float, t_step: float) -> float:
    """(t_compute + t_comm − t_step) / t_comm: the share of communication hidden by computation.

    1 when the step takes no longer than its computation, 0 when compute and communication
    simply add up, negative when running them together is slower than one after the other.
    """
    if not t_comm > 0:
        raise ValueError(f"t_comm must be positive, got {t_comm}")
    return (t_compute + t_comm - t_step) / t_comm


def scaling_rows(report: dict, model: str) -> list[tuple[str, int, dict]]:
    """(label, processes, result) for one model of a bench_scaling JSON: DataParallel (if it
    ran), then DDP by process count. Each result has its own ``one_process_s`` baseline (timed
    alternately with it) and ``speedup`` over it."""
    m = report["models"][model]
    rows = []
    if "step_s" in m.get("data_parallel", {}):
        rows.append(("DataParallel", report["gpus"], m["data_parallel"]))
    rows += [("DDP", int(n), r) for n, r in sorted(m["ddp"].items(), key=lambda kv: int(kv[0]))]
    return rows
