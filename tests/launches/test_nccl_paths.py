"""What every script does on a GPU machine, checked on a CPU: which backend and GPU it joins with.

A CPU run never takes a script's nccl branch. Here each script runs (in one subprocess) with
CUDA faked: ``torch.cuda`` reports 8 GPUs, ``torch.cuda.set_device`` and
``dist.init_process_group`` record their arguments, and the join ends the script. On nccl,
``init_process_group`` must get ``device_id``: the GPU the process set, so that nccl makes the
communicator at once and ``barrier()`` knows its GPU (without it, rank 0 warns at its first
barrier and errors surface late). Every way a script joins is taken: under torchrun, under
torchrun's restartable agent store, and as a plain ``python`` run.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from helpers import run_until_joined
from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parents[2]

# Two nodes of two processes each; this is the second process of the second node.
TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RESTART_COUNT": "0",
}
AGENT_STORE = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}
PLAIN = {}

# Scripts that join no group of their own: the setup module that the others import, a busy loop,
# one process, an mp.spawn launcher, and the modules that the lab checkers import (the student's code).
NO_GROUP = {
    "dist_setup.py",
    "c03_gil_busy_loop.py",
    "train_single.py",
    "c04_mp_spawn.py",
    "lab03_ring.py",
    "lab05_my_ddp.py",
    "lab07_tp.py",
    "lab08_sharded_optimizer.py",
    "lab11_zero3.py",
    "lab13_ring.py",
}
# What a script needs to reach its join (arguments, or a function to call instead of __main__).
ARGS = {
    "c09_failures.py": ["mismatch"],
    "c04_train_ddp.py": ["--out", "OUT"],
    "train_ddp.py": ["--out", "OUT"],
    "train_gpt.py": ["--parallel", "ddp", "--out", "OUT"],
    "c11c_accumulation.py": ["--out", "OUT"],
    "c13a_context_parallel.py": ["--out", "OUT"],
    # Its hung and mismatched jobs refuse where GPUs are visible; the straggler runs on nccl.
    "c14b_debugging.py": ["straggler", "--out", "OUT"],
    "c14c_talking_less.py": ["--mode", "hooks", "--out", "OUT"],
    "c17a_float8_fsdp.py": ["--out", "OUT"],
    "c17b_compile_sharded.py": ["--part", "layouts", "--out", "OUT"],
    "lab04_buggy.py": ["--out", "OUT"],
    "lab04_fixed.py": ["--out", "OUT"],
    "lab05_check.py": ["--only", "DDP"],
    "lab09_train.py": ["--out", "OUT"],
}
CALL = {"c03_spawn_worker.py": ("worker", [1, 2, "env://", None])}  # mp.spawn's worker, rank 1 of 2
# Scripts that take a path only under torchrun's agent store (a store per restarted attempt).
RESTARTABLE = {
    "train_ddp.py": ARGS["train_ddp.py"],
    "lab09_train.py": ARGS["lab09_train.py"],
    "c09_failures.py": ["stale-store"],
}


def course_scripts(tmp_path: Path) -> dict[str, Path]:
    """scripts/*.py, and the scripts the lab solutions write (into tmp_path, beside each other and
    beside the setup module they import, as a lab's work/ folder holds them)."""
    found = {path.name: path for path in sorted((ROOT / "scripts").glob("*.py"))}
    (tmp_path / "dist_setup.py").write_text((ROOT / "scripts" / "dist_setup.py").read_text())
    for notebook in sorted((ROOT / "solutions").glob("*.ipynb")):
        for name, versions in written_scripts(notebook).items():
            (tmp_path / name).write_text(versions[-1])
            found[name] = tmp_path / name
    return found


def record_joins(scripts: dict[str, Path], groups: dict[str, tuple[dict, dict]], tmp_path: Path) -> dict:
    """For each group (an environment and the runs made in it), how each script joined, with 8 fake GPUs."""
    specs = []
    for group, (environment, runs) in groups.items():
        for name, extra in runs.items():
            argv = [str(scripts[name]), *[str(tmp_path / "out") if a == "OUT" else a for a in extra]]
            call, args = CALL.get(name, (None, []))
            specs.append((group, name, {"environment": environment, "argv": argv, "call": call, "args": args}))
    found = defaultdict(dict)
    for (group, name, _), run in zip(specs, run_until_joined([s for *_, s in specs], tmp_path, fake_gpus=8)):
        found[group][name] = run
    return found


def assert_bound_to_its_gpu(found: dict, local_rank: int):
    wrong = []
    # The lab 04 bug hunt's broken script joins through the setup module too: its bug (the global
    # rank as its GPU, M6) comes after the join.
    for name, run in found.items():
        expected = local_rank
        if run["stopped"] != "joined a group":
            wrong.append(f"{name}: {run['stopped']} {run['errors']}")
        elif [c["backend"] for c in run["joins"]] != ["nccl"]:
            wrong.append(f"{name}: joined with {run['joins']} on a machine with a GPU per process (expected nccl)")
        elif run["set_device"] != [f"cuda:{expected}"]:
            wrong.append(f"{name}: set_device({run['set_device']}), expected cuda:{expected}")
        elif run["joins"][0]["device_id"] != f"cuda:{expected}":
            found = run["joins"][0]["device_id"]
            wrong.append(f"{name}: init_process_group(device_id={found}), expected cuda:{expected}")
    assert not wrong, "on nccl, every group must be bound to the process's GPU:\n" + "\n".join(wrong)


@pytest.fixture(scope="module")
def joins(tmp_path_factory):
    """Every script run as it is under torchrun, after a restart, and as plain python, with 8 fake GPUs."""
    scripts = course_scripts(tmp_path_factory.mktemp("scripts"))
    under_torchrun = {name: ARGS.get(name, []) for name in scripts if name not in NO_GROUP}
    # Scripts that also run without torchrun (what every training script of the course accepts).
    plain = {name: ARGS.get(name, []) for name in scripts if name.startswith(("train_", "bench_"))}
    plain.update({name: [] for name in scripts if name.startswith(("c05_", "c06_", "c07_", "c08_", "c11_"))})
    plain = {name: args for name, args in plain.items() if name not in NO_GROUP}
    groups = {"torchrun": (TORCHRUN, under_torchrun), "restart": (AGENT_STORE, RESTARTABLE), "plain": (PLAIN, plain)}
    return record_joins(scripts, groups, tmp_path_factory.mktemp("runs"))


def test_under_torchrun_every_script_binds_its_nccl_group_to_local_rank(joins):
    assert len(joins["torchrun"]) >= 25, sorted(joins["torchrun"])
    assert_bound_to_its_gpu(joins["torchrun"], local_rank=1)


def test_after_a_restart_each_attempt_binds_its_group_too(joins):
    assert_bound_to_its_gpu(joins["restart"], local_rank=1)


def test_a_plain_python_run_binds_its_group_of_one_to_cuda_0(joins):
    assert len(joins["plain"]) >= 10, sorted(joins["plain"])
    assert_bound_to_its_gpu(joins["plain"], local_rank=0)
