"""What this machine offers for parallel training, and what the course will use."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass
class Machine:
    python: str
    torch: str
    cuda_build: str | None  # CUDA version torch was built with, None for a CPU build
    logical_cores: int
    physical_cores: int | None
    gpus: list[str] = field(default_factory=list)
    backends: dict[str, bool] = field(default_factory=dict)


def physical_cores() -> int | None:
    try:
        import psutil

        return psutil.cpu_count(logical=False)
    except ImportError:  # psutil is a course dependency, but this must never crash
        return None


def usable_cores() -> int:
    """Cores this process may run on (respects taskset/cgroups where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def describe() -> Machine:
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return Machine(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda_build=torch.version.cuda,
        logical_cores=usable_cores(),
        physical_cores=physical_cores(),
        gpus=gpus,
        backends={"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()},
    )


def pick_backend(num_gpus: int, backends: dict[str, bool], world_size: int) -> str:
    """The backend the course uses: nccl when every local rank gets its own GPU, else gloo."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    if num_gpus >= world_size and backends.get("nccl"):
        return "nccl"
    if backends.get("gloo"):
        return "gloo"
    raise RuntimeError("neither nccl (with a GPU per process) nor gloo is available")


def recommended_world_size(num_gpus: int, cores: int) -> int:
    """Processes to launch on one machine: one per GPU; on CPU, 2 (or up to 4 if there are
    cores for them), since each process needs a core of its own to run in parallel."""
    if num_gpus < 0 or cores < 1:
        raise ValueError(f"need num_gpus >= 0 and cores >= 1, got {num_gpus} and {cores}")
    if num_gpus >= 1:
        return num_gpus
    return max(2, min(4, cores))


def implications(m: Machine) -> list[str]:
    """Plain-language consequences of this machine for the course, one line each."""
    lines = []
    n_gpu = len(m.gpus)
    if n_gpu == 0:
        why = "a CPU build of torch" if m.cuda_build is None else "no GPU is visible"
        lines.append(
            f"No GPU ({why}): every chapter runs on the CPU with the gloo backend and "
            "several processes. Speed-ups you measure are CPU speed-ups; GPU-only features "
            "(nccl, CUDA AMP with fp16, FSDP CPU offload) are explained, not run."
        )
    elif n_gpu == 1:
        lines.append(
            "One GPU: single-rank runs use nccl on cuda:0; runs with more ranks than GPUs "
            "use gloo on the CPU (nccl needs one GPU per process)."
        )
    else:
        lines.append(f"{n_gpu} GPUs: runs with up to {n_gpu} ranks use nccl, one GPU per rank.")
    if not m.backends.get("nccl"):
        lines.append("nccl is not available in this torch build: the course uses gloo.")
    if not m.backends.get("mpi"):
        lines.append("mpi is not built in (normal for pip wheels): the course never needs it.")
    if m.logical_cores < 2:
        lines.append(
            "Only one core: multi-process examples still run and stay correct, but "
            "processes take turns, so nothing gets faster."
        )
    ws = recommended_world_size(n_gpu, m.logical_cores)
    lines.append(f"Suggested world size on this machine: {ws}.")
    return lines


def report(m: Machine | None = None) -> None:
    """Print the machine description and its consequences for the course."""
    m = m or describe()
    cores = f"{m.logical_cores} usable logical cores"
    if m.physical_cores:
        cores += f" ({m.physical_cores} physical)"
    print(f"CPU: {cores}")
    print(f"GPUs: {len(m.gpus)}" + "".join(f"\n  cuda:{i}  {n}" for i, n in enumerate(m.gpus)))
    print("backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m.backends.items()))
    for line in implications(m):
        print("- " + line)


def environment_name(prefix: str | None = None) -> str:
    """Which Python environment runs this: the course's ``.venv`` or another one.

    Says it in words a student can compare with their own machine, never as an absolute path
    (which would carry the author's user and folder names into stored outputs).
    """
    prefix_path = Path(prefix or sys.prefix).resolve()
    course_venv = (Path(__file__).resolve().parents[2] / ".venv").resolve()
    if prefix_path == course_venv:
        return "the course's .venv"
    if os.environ.get("CONDA_DEFAULT_ENV"):
        return f"conda environment {os.environ['CONDA_DEFAULT_ENV']!r}"
    return "a Python environment outside the course's .venv"


def versions() -> None:
    """Python and torch versions, the environment, and the threads this kernel computes with."""
    m = describe()
    print(f"python {m.python} ({environment_name()})")
    print(f"torch  {m.torch}" + (f" (CUDA {m.cuda_build})" if m.cuda_build else " (CPU build)"))
    print(f"torch threads in this kernel: {torch.get_num_threads()}")


def placement(num_gpus: int, world_size: int, backends: dict[str, bool] | None = None) -> list[str]:
    """Where each local rank of a one-node job runs, by the course's rule: one line per rank.

    With a GPU for every rank: ``cuda:LOCAL_RANK`` over nccl; otherwise every rank on the CPU
    over gloo (two ranks cannot share a GPU under nccl).
    """
    if num_gpus < 0:
        raise ValueError(f"number of GPUs must be >= 0, got {num_gpus}")
    backends = backends or {"gloo": True, "nccl": True}
    backend = pick_backend(num_gpus, backends, world_size)
    return [f"rank {r}: {'cuda:' + str(r) if backend == 'nccl' else 'cpu'} ({backend})" for r in range(world_size)]
