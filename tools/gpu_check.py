"""make gpu-check: is this GPU node ready for the course? One command, with the node's own Python
and torch (2.11 or newer), no install and no network.

It runs every lane of the GPU tests (tests/gpu/test_gpu.py) that the node can: the scripts on nccl
at every GPU count the node has (1, 2, 4, 8 and all, each in a CUDA_VISIBLE_DEVICES of its own
taken from the visible list), CUDA mixed precision, the memory paths, the flight recorder's, the
notebooks when nbval (and so the notebook tool chain) is installed; it skips the others, saying
why: no GPU, too few, a torch older than the lane needs, a module missing. It prints one table
(lane, result, reason, time) and writes the same as JSON (build/gpu-check.json).

    python tools/gpu_check.py [--json PATH] [--budget SECONDS] [--only NAME ...]

Without GPUs every lane is skipped with its reason within seconds. The lanes share a time budget
(default 480 s: about 8 minutes on one GPU); a lane still running when it is spent is stopped and
reported as such, with what it had finished.
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The modules each kind of lane needs beside torch: pytest runs the lane's tests (psutil bounds their
# launches); the notebook lane executes notebooks (nbval brings nbclient and the kernel's chain).
LANE_MODULES = ("pytest", "psutil", "nbformat")
# 17a and 17b import torchao (pinned in pyproject.toml).
NOTEBOOK_MODULES = ("nbval", "nbclient", "ipykernel", "torchao")
# The oldest torch the course's scripts are meant to run on (a cluster's module): older ones refuse.
OLDEST_TORCH = "2.11"


@dataclass
class Facts:
    """What the node has: torch's version, CUDA, the GPUs torch sees (their CUDA_VISIBLE_DEVICES
    entries), nccl, and which of the modules the lanes need are installed."""

    torch: str
    cuda: bool
    gpus: list[str]
    nccl: bool
    modules: dict[str, bool]
    cuda_reason: str = ""


@dataclass
class Lane:
    """A selection of the GPU tests (pytest -k), run with the first ``use`` GPUs (None: all)."""

    name: str
    select: str
    gpus: int = 1
    use: int | None = None
    torch: str = OLDEST_TORCH
    modules: tuple[str, ...] = LANE_MODULES
    what: str = ""


@dataclass
class Result:
    lane: str
    result: str  # passed, failed, skipped, stopped
    reason: str
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)


def version_tuple(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def gpu_counts(gpus: int) -> list[int]:
    """The GPU counts the scripts lane runs at: 1, 2, 4, 8 up to the node's, and the node's own."""
    return sorted({n for n in (1, 2, 4, 8) if n <= gpus} | ({gpus} if gpus else set())) or [1]


def lanes(gpus: int) -> list[Lane]:
    """Every lane, for a node with ``gpus`` GPUs (at least the 1-GPU ones where it has none)."""
    # The short lanes first: on one GPU the scripts' lane alone took 420 s of the default 480
    # (H200, 2026-11-28), and the lanes after it were left out.
    found = [
        Lane("CUDA mixed precision", "test_c06_amp", what="fp16 autocast, GradScaler, unscale before clipping"),
        Lane(
            "memory",
            "test_pinned_copies or test_train_gpt_layouts or test_deterministic_mode",
            what="pinned and pageable copies; the capstone's layouts and their memory on 2 GPUs",
        ),
        Lane(
            "flight recorder",
            "c14b",
            torch="2.13",
            what="c14b on nccl: the flight record's reader is written against torch 2.13's records",
        ),
    ]
    found += [
        Lane(
            f"scripts on nccl, {n} GPU(s)",
            "(test_every_script_at_every_gpu and not c14b) or test_train_ddp_on_nccl or test_bench_allreduce",
            gpus=n,
            use=n,
            what="every script at --nproc_per_node = the GPUs, or its one-line refusal",
        )
        for n in gpu_counts(gpus)
    ]
    found += [
        Lane(
            "nccl-only paths",
            "sync_batch_norm or c05_sync or c09 or crash or data_parallel or lab_checker or 06a",
            gpus=2,
            what="SyncBatchNorm, 09's demos, a crash resumed, real DataParallel, the lab checkers, 06a's ring",
        ),
        Lane(
            "capstone layouts",
            "test_train_gpt and not layouts_on_nccl or test_context_parallel",
            gpus=2,
            what="train_gpt.py's other layouts (accumulation, pipeline, checkpoints, experts, context) on nccl",
        ),
        Lane(
            "notebooks",
            "test_notebook_runs_on_the_gpus",
            torch="2.13",
            modules=LANE_MODULES + NOTEBOOK_MODULES,
            what="every notebook on the GPUs against its stored outputs, made with torch 2.13",
        ),
    ]
    return found


def skip_reason(lane: Lane, facts: Facts) -> str | None:
    """Why this node cannot run the lane, in one line, or None."""
    if not facts.cuda:
        # The CUDA check's findings (machine.cuda_findings): no GPU, or one CUDA cannot use.
        return facts.cuda_reason or "no GPU"
    if not facts.nccl:
        return f"torch {facts.torch} has no nccl"
    if len(facts.gpus) < lane.gpus:
        return f"needs {lane.gpus} GPUs, the node has {len(facts.gpus)}"
    if version_tuple(facts.torch) < version_tuple(lane.torch):
        return f"needs torch {lane.torch} or newer; this is torch {facts.torch}"
    missing = [m for m in lane.modules if not facts.modules.get(m)]
    if missing:
        return f"{', '.join(missing)} not installed for {Path(sys.executable).name} (no network: bring wheels)"
    return None


PYTEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")
SKIP_LINE = re.compile(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$")


def read_pytest(output: str) -> tuple[dict[str, int], list[str], list[str]]:
    """From pytest -v -rs output: the count of each outcome, the failed tests, the skip reasons."""
    counts, failed, skipped = {}, [], []
    for line in output.splitlines():
        if found := PYTEST_LINE.match(line):
            outcome = found.group(2).lower()
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome in ("failed", "error"):
                failed.append(found.group(1).split("::", 1)[1])
        elif found := SKIP_LINE.match(line):
            skipped.append(found.group(1))
    return counts, failed, skipped


def verdict(lane: Lane, counts: dict[str, int], failed: list[str], skipped: list[str], stopped: bool) -> tuple:
    """(result, reason) of a lane's pytest run."""
    done = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    if failed:
        return "failed", f"{done}: {', '.join(failed[:3])}{' ...' if len(failed) > 3 else ''}"
    if stopped:
        return "stopped", f"the time budget ran out ({done or 'nothing finished'})"
    if counts.get("passed"):
        refused = f"; skipped: {skipped[0]}" if skipped else ""
        return "passed", done + refused
    if skipped:
        return "skipped", skipped[0]
    return "failed", "no test ran"


def lane_environment(lane: Lane, facts: Facts) -> dict[str, str]:
    """The lane's environment: the first ``use`` of the node's GPUs, the course's package on the path."""
    env = dict(os.environ)
    if lane.use is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(facts.gpus[: lane.use])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_lane(lane: Lane, facts: Facts, timeout: float) -> Result:
    """The lane's tests under pytest, bounded by timeout (the whole process group is stopped then)."""
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-p", "no:xdist"]
    if not facts.modules.get("nbval"):
        cmd += ["-p", "no:nbval"]
    cmd += ["-m", "gpu", "-k", lane.select, "-v", "-rs", "tests/gpu/test_gpu.py"]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=lane_environment(lane, facts),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    stopped = False
    try:
        output, _ = proc.communicate(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        stopped = True
    counts, failed, skipped = read_pytest(output)
    result, reason = verdict(lane, counts, failed, skipped, stopped)
    return Result(lane.name, result, reason, time.monotonic() - start, counts)


def gather_facts() -> Facts:
    """This node's facts, without making a CUDA context here (the lanes' processes make their own)."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from parallel_course import machine
    from parallel_course.visible_gpus import visible_entries

    count = torch.cuda.device_count()
    cuda = torch.cuda.is_available() and count > 0
    reason = "" if cuda else "; ".join(machine.cuda_findings(machine.cuda_facts()))
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    modules = {m: importlib.util.find_spec(m) is not None for m in (*LANE_MODULES, *NOTEBOOK_MODULES)}
    gpus = visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"), count) if cuda else []
    return Facts(torch.__version__, cuda, gpus, nccl, modules, reason)


def check(facts: Facts, budget: float, only: list[str] | None = None, runner=run_lane) -> list[Result]:
    """Every lane: skipped with its reason, or run within what is left of the budget."""
    results, deadline = [], time.monotonic() + budget
    for lane in lanes(len(facts.gpus)):
        if only and not any(word in lane.name for word in only):
            continue
        reason = skip_reason(lane, facts)
        left = deadline - time.monotonic()
        if reason is None and left <= 0:
            reason = "the time budget was spent before it"
        if reason is not None:
            results.append(Result(lane.name, "skipped", reason, 0.0))
            continue
        results.append(runner(lane, facts, left))
    return results


def table(results: list[Result], facts: Facts) -> str:
    """One table: lane, result, reason, time; with the node's torch and GPUs above it."""
    rows = [("lane", "result", "reason", "time")]
    rows += [(r.lane, r.result, r.reason, f"{r.seconds:.0f} s") for r in results]
    # A long reason is cut in the table; the JSON report keeps it whole.
    widths = [max(len(row[k]) for row in rows) for k in range(3)]
    widths[2] = min(widths[2], 110)
    lines = [f"gpu-check: torch {facts.torch}, {len(facts.gpus)} GPU(s), nccl {'yes' if facts.nccl else 'no'}"]
    for row in rows:
        reason = row[2] if len(row[2]) <= widths[2] else row[2][: widths[2] - 3] + "..."
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {reason:<{widths[2]}}  {row[3]:>6}")
    return "\n".join(line.rstrip() for line in lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "gpu-check.json", help="the report as JSON")
    parser.add_argument("--budget", type=float, default=480, help="seconds for all the lanes (default 480)")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="only the lanes whose name has one of these")
    args = parser.parse_args(argv)
    start = time.monotonic()
    if importlib.util.find_spec("torch") is None:
        parser.error(f"{sys.executable} has no torch: name the node's Python, e.g. make gpu-check PYTHON=python3")
    facts = gather_facts()
    results = check(facts, args.budget, args.only)
    sys.stdout.write(table(results, facts) + "\n")
    report = {
        "facts": asdict(facts),
        "results": [asdict(r) for r in results],
        "seconds": round(time.monotonic() - start, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    sys.stdout.write(f"wrote {args.json} ({report['seconds']:.0f} s)\n")
    return 1 if any(r.result in ("failed", "stopped") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
