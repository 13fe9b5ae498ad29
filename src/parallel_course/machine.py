"""What this machine offers for parallel training, and what the course will use."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
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
    """Cores this process may run on (respects taskset and cpusets; not CPU quotas, e.g. docker --cpus)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def core_share(seconds: float = 0.05) -> float:
    """The part of ``seconds`` of wall time in which a busy loop in this thread had a core: about 1
    when the machine has one free for this process, less when other work holds the cores (or this
    process's other threads hold Python's lock). What a claim about speed needs before it is
    asserted: the speed the machine shows depends on it."""
    wall_end = time.perf_counter() + seconds
    cpu_start, wall_start = time.thread_time(), time.perf_counter()
    while time.perf_counter() < wall_end:
        pass
    return min(1.0, (time.thread_time() - cpu_start) / (time.perf_counter() - wall_start))


def describe() -> Machine:
    """This machine, asked without initialising CUDA in this process (``device_count()`` asks the
    driver's NVML; the GPUs' names come from a short-lived child process), so that a notebook can
    still fork and its GPUs stay free for the jobs it launches."""
    gpus = [gpu["name"] for gpu in cuda_devices()] if torch.cuda.device_count() > 0 else []
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
    print("CUDA:")
    for line in cuda_findings(cuda_facts()):
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
    """Python and torch versions, the environment, and the threads this kernel computes with (CUDA
    is left alone: a kernel that initialised it could no longer fork, chapters 03 and 12)."""
    print(f"python {platform.python_version()} ({environment_name()})")
    print(f"torch  {torch.__version__}" + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU build)"))
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


# --------------------------------------------------------------------------- CUDA: usable, and safe to share

# The oldest NVIDIA driver each CUDA major version runs on (Linux; CUDA's release notes, table 3).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
_DEVICE_QUERY = (
    "import json, torch; print(json.dumps([{'name': torch.cuda.get_device_name(i), "
    "'capability': '.'.join(map(str, torch.cuda.get_device_capability(i)))} "
    "for i in range(torch.cuda.device_count())]))"
)


def cuda_devices() -> list[dict]:
    """Name and capability (``"8.0"``) of every GPU torch can use, asked in a child process: the
    CUDA context it makes ends with it, and this process stays free to fork and to share the GPUs."""
    try:
        out = subprocess.run([sys.executable, "-c", _DEVICE_QUERY], capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []


def nvidia_smi(*fields: str) -> list[list[str]] | None:
    """One row per GPU of ``nvidia-smi --query-gpu=FIELDS``; None where there is no NVIDIA driver."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


@dataclass
class CudaFacts:
    torch_version: str
    cuda_build: str | None  # torch.version.cuda: None for a CPU build
    arch_list: list[str]  # torch.cuda.get_arch_list(): the GPU architectures this build has kernels for
    driver: str | None  # the NVIDIA driver's version, None where nvidia-smi does not answer
    gpus: list[dict]  # what nvidia-smi lists: name, capability ("8.0"), compute mode
    usable: bool  # torch.cuda.is_available()


def cuda_facts() -> CudaFacts:
    """What decides whether torch can use the GPUs. ``torch.cuda.is_available()`` starts the driver in
    this process, after which a fork cannot use CUDA: for a report (chapter 00), not for a kernel that
    forks later (chapter 12)."""
    rows = nvidia_smi("name", "driver_version", "compute_cap", "compute_mode") or []
    gpus = [{"name": r[0], "capability": r[2], "compute_mode": r[3]} for r in rows if len(r) == 4]
    return CudaFacts(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        arch_list=torch.cuda.get_arch_list(),
        driver=rows[0][1] if rows and len(rows[0]) > 1 else None,
        gpus=gpus,
        usable=torch.cuda.is_available(),
    )


def has_kernels_for(capability: str, arch_list: list[str]) -> bool:
    """Whether a build with these architectures runs on a GPU of this capability ("7.5"): a binary for
    the same major version and an older or equal minor one (sm_80 runs on 8.6), or PTX (compute_XX)
    for an older or equal one, which the driver compiles."""
    major, minor = (int(v) for v in capability.split("."))
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        code = int(number.rstrip("af") or 0)
        if kind == "sm" and code // 10 == major and code % 10 <= minor:
            return True
        if kind == "compute" and code <= 10 * major + minor:
            return True
    return False


def cuda_findings(f: CudaFacts) -> list[str]:
    """What the facts mean for the course, and how to fix what is wrong: one line each."""
    if not f.gpus:
        kind = "a CPU build" if f.cuda_build is None else f"a CUDA {f.cuda_build} build"
        return [f"no NVIDIA GPU answers (nvidia-smi) and torch {f.torch_version} is {kind}: the course runs on the CPU"]
    names = ", ".join(sorted({g["name"] for g in f.gpus}))
    seen = f"{len(f.gpus)} NVIDIA GPU(s) ({names}), driver {f.driver}"
    if f.cuda_build is None:
        return [
            f"{seen}, but torch {f.torch_version} is a CPU build: everything runs on the CPU. Install a CUDA "
            "build of torch 2.13.0 into .venv (the README's 'Running on a GPU node')"
        ]
    lines = [f"{seen}; torch {f.torch_version} is built for CUDA {f.cuda_build}"]
    major = int(f.cuda_build.split(".")[0])
    driver_major = int(f.driver.split(".")[0]) if f.driver and f.driver.split(".")[0].isdigit() else None
    if not f.usable:
        too_old = driver_major is not None and driver_major < MIN_DRIVER.get(major, 0)
        why = (
            f"CUDA {major} needs driver {MIN_DRIVER[major]} or newer"
            if too_old
            else "CUDA cannot start (torch.cuda.is_available() is False)"
        )
        lines.append(
            f"the GPUs are present but UNUSABLE: {why}, and everything silently runs on the CPU. Fix: "
            "update the driver, or install the torch 2.13.0 build for the CUDA version your driver "
            "supports (nvidia-smi shows it; the README's 'Running on a GPU node')"
        )
        return lines
    for gpu in f.gpus:
        if not has_kernels_for(gpu["capability"], f.arch_list):
            sm = "sm_" + gpu["capability"].replace(".", "")
            lines.append(
                f"{gpu['name']} ({sm}) is not among this build's architectures ({' '.join(f.arch_list)}): "
                "its kernels fail with 'no kernel image is available'. Fix: a torch build for an older CUDA "
                f"that still includes {sm} (PyTorch's install matrix)"
            )
    if any(g["compute_mode"].startswith("Exclusive") for g in f.gpus):
        lines.append(
            "a GPU is in exclusive-process mode: one process at a time may use it, so the notebooks "
            "compute on the CPU in their own kernel and leave the GPUs to the jobs they launch"
        )
    if len(lines) == 1:
        lines.append("CUDA is usable: the course uses nccl, one GPU per process")
    return lines


def kernel_may_use_gpus() -> bool:
    """Whether a notebook may compute on a GPU in its own kernel before it launches jobs with !torchrun.

    Not without CUDA, and not where a GPU is in exclusive-process mode (nvidia-smi's compute mode, set on
    many shared clusters): such a GPU takes one CUDA context at a time, and one held by the kernel would
    lock the next job's rank 0 out of cuda:0.
    """
    if not torch.cuda.is_available():
        return False
    modes = nvidia_smi("compute_mode") or []
    return not any(row and row[0].startswith("Exclusive") for row in modes)
