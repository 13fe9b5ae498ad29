"""What every script does on a GPU machine, checked on a CPU: which backend and GPU it joins with.

A CPU run never takes a script's nccl branch. Here each script runs (in one subprocess) with
CUDA faked: ``torch.cuda`` reports 8 GPUs, ``torch.cuda.set_device`` and
``dist.init_process_group`` record their arguments, and the join ends the script. On nccl,
``init_process_group`` must get ``device_id``: the GPU the process set, so that nccl makes the
communicator at once and ``barrier()`` knows its GPU (without it, rank 0 warns at its first
barrier and errors surface late). Every way a script joins is taken: under torchrun, under
torchrun's restartable agent store, and as a plain ``python`` run.

Which scripts, with which arguments, is read from the scripts (script_usage.py): every script and lab
script that joins a group, with the command lines its docstring gives; a new script needs no entry
here.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from helpers import run_until_joined
from script_usage import commands, course_scripts, joins_a_group, spawns

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


def cases(scripts: dict[str, Path]) -> dict[str, tuple[dict, list]]:
    """The runs of each environment, read from the scripts themselves (script_usage.py): every
    script that joins a group, with each command line its docstring gives (or the options its parser
    requires); those with --max-restarts under torchrun's restartable agent store; as plain python,
    each script that joins through dist_setup.py with its first command line."""
    runs = {"torchrun": [], "restart": [], "plain": []}
    for name, path in scripts.items():
        text = path.read_text()
        if not joins_a_group(text):
            continue
        found = commands(name, text)
        runs["torchrun"] += [(name, u.argv) for u in found if not u.restartable]
        runs["restart"] += [(name, u.argv) for u in found if u.restartable]
        # A plain python run is a group of one through dist_setup.py's setup(); chapters 00 and 03
        # build the block by hand, for torchrun alone, and a spawning script sets its own ranks.
        if "from dist_setup import" in text and not spawns(text):
            runs["plain"].append((name, next(u.argv for u in found if not u.restartable)))
    environments = {"torchrun": TORCHRUN, "restart": AGENT_STORE, "plain": PLAIN}
    return {group: (environments[group], found) for group, found in runs.items()}


def record_joins(scripts: dict[str, Path], groups: dict[str, tuple[dict, list]], tmp_path: Path) -> dict:
    """For each group (an environment and its runs), how each run joined, with 8 fake GPUs."""
    specs = [
        (group, (name, argv), {"environment": environment, "argv": [str(scripts[name]), *argv]})
        for group, (environment, runs) in groups.items()
        for name, argv in runs
    ]
    found = defaultdict(dict)
    for (group, key, _), run in zip(specs, run_until_joined([s for *_, s in specs], tmp_path, fake_gpus=8)):
        found[group][key] = run
    return found


def assert_bound_to_its_gpu(found: dict, local_rank: int, refusals_allowed: bool = False):
    """Every run joined with nccl bound to cuda:local_rank (or, where allowed, refused in one line
    before joining, as a script may on a machine with GPUs or at this count, or stopped for want of
    an input file its command line names)."""
    wrong = []
    for (name, argv), run in found.items():
        what = f"{name} {' '.join(argv)}".strip()
        if run["stopped"] != "joined a group":
            refused = run["stopped"].startswith("exit") and len(run["errors"]) == 1 and name in run["errors"][0]
            # A command line that reads a file of its own (c07's --orders orders.json) has none here.
            no_input = run["stopped"].startswith("FileNotFoundError") and any(a in run["stopped"] for a in argv)
            if not (refusals_allowed and (refused or no_input)):
                wrong.append(f"{what}: {run['stopped']} {run['errors']}")
        elif [c["backend"] for c in run["joins"]] != ["nccl"]:
            wrong.append(f"{what}: joined with {run['joins']} on a machine with a GPU per process (expected nccl)")
        elif run["set_device"] != [f"cuda:{local_rank}"]:
            wrong.append(f"{what}: set_device({run['set_device']}), expected cuda:{local_rank}")
        elif (device_id := run["joins"][0]["device_id"]) != f"cuda:{local_rank}":
            wrong.append(f"{what}: init_process_group(device_id={device_id}), expected cuda:{local_rank}")
    assert not wrong, "on nccl, every group must be bound to the process's GPU:\n" + "\n".join(wrong)


def joined(found: dict) -> set[str]:
    return {name for (name, _), run in found.items() if run["stopped"] == "joined a group"}


@pytest.fixture(scope="module")
def joins(tmp_path_factory):
    """Every script run as it is under torchrun, after a restart, and as plain python, with 8 fake GPUs."""
    scripts = course_scripts(tmp_path_factory.mktemp("scripts"))
    return record_joins(scripts, cases(scripts), tmp_path_factory.mktemp("runs"))


def test_under_torchrun_every_script_binds_its_nccl_group_to_local_rank(joins):
    # The lab 04 bug hunt's broken script joins through the setup module too: its bug (the global
    # rank as its GPU, M6) comes after the join. A command line may be refused here (c14b's hung and
    # mismatched jobs where GPUs are visible), but every script joins with at least one of its own.
    assert_bound_to_its_gpu(joins["torchrun"], local_rank=1, refusals_allowed=True)
    scripts = {name for name, _ in joins["torchrun"]}
    assert joined(joins["torchrun"]) == scripts and len(scripts) >= 30, sorted(scripts - joined(joins["torchrun"]))


def test_after_a_restart_each_attempt_binds_its_group_too(joins):
    assert {name for name, _ in joins["restart"]} >= {"train_ddp.py", "c09_failures.py"}
    assert_bound_to_its_gpu(joins["restart"], local_rank=1)


def test_a_plain_python_run_binds_its_group_of_one_to_cuda_0(joins):
    # A plain run is one process: a script that needs more refuses in one line.
    assert_bound_to_its_gpu(joins["plain"], local_rank=0, refusals_allowed=True)
    assert len(joined(joins["plain"])) >= 25, sorted(joined(joins["plain"]))


NEW_SCRIPT = '''"""A new chapter's script.

    torchrun --standalone --nproc_per_node=2 c99_new.py --mode a [--out DIR]
    torchrun --standalone --nproc_per_node=2 --max-restarts=1 c99_new.py --mode b  # restarted
"""

from dist_setup import setup

if __name__ == "__main__":
    setup()
'''


def test_the_cases_are_read_from_the_scripts(tmp_path):
    """What the cases above come from, on two small scripts: one that joins and says how it runs
    (under torchrun, and after a restart), one that is a module and joins nothing."""
    (tmp_path / "c99_new.py").write_text(NEW_SCRIPT)
    (tmp_path / "lab99_answer.py").write_text("def answer():\n    return 42\n")
    found = cases({p.name: p for p in sorted(tmp_path.glob("*.py"))})
    assert found["torchrun"][1] == [("c99_new.py", ("--mode", "a"))]
    assert found["restart"][1] == [("c99_new.py", ("--mode", "b"))]
    assert found["plain"][1] == [("c99_new.py", ("--mode", "a"))]
