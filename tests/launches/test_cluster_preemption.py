"""scripts/cluster/train_gpt.sbatch: training through preemption on SLURM (no cluster here).

- the batch script passes ``bash -n``; it asks SLURM for a signal before the time limit and for
  requeueing; torchrun handles SIGUSR1; the script's arguments are accepted by ``train_gpt.py``;
- its decision once torchrun has returned, sourced and called alone: metrics.json written ->
  done; a checkpoint newer than the one the run started from -> requeue; else a crash (an
  incomplete checkpoint, without .metadata, counts for nothing);
- end to end with stand-ins for ``srun`` and ``scontrol`` on two emulated nodes (CPU and gloo): the
  stand-in srun sends SIGUSR1 to every process of the step after the first step, as SLURM does
  before a time limit; the workers save, the script calls ``scontrol requeue``; the requeued run
  resumes from that checkpoint and finishes; a third run finds the job trained and launches nothing.
"""

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from test_cluster import emulated_job_environment, free_port_for_job_id, srun_command, stand_ins

from helpers import load_script
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "scripts" / "cluster" / "train_gpt.sbatch"
HANDLED = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"

# Stand-in for srun: the command once per node (one task per node), each node's output in
# $SRUN_LOG_DIR/nodeN.log. With $PREEMPT_WHEN set: once that text shows in node 0's log, SIGUSR1 to
# every process of the job step (each torchrun and its workers), as `#SBATCH --signal=USR1@...`
# does before the time limit.
SRUN = f"""#!{sys.executable}
import os, signal, subprocess, sys, time
import psutil

command = sys.argv[1:]
while command[0].startswith("--"):
    command.pop(0)
logs = os.environ["SRUN_LOG_DIR"]
nodes = []
for i in range(int(os.environ["SLURM_NNODES"])):
    with open(f"{{logs}}/node{{i}}.log", "w") as log:
        env = dict(os.environ, SLURM_NODEID=str(i), SLURM_PROCID=str(i))
        nodes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
when = os.environ.get("PREEMPT_WHEN")
while when and all(node.poll() is None for node in nodes):
    with open(f"{{logs}}/node0.log") as log:
        if when in log.read():
            step = [psutil.Process(node.pid) for node in nodes]
            for process in step + [c for p in step for c in p.children(recursive=True)]:
                try:
                    process.send_signal(signal.SIGUSR1)
                except psutil.NoSuchProcess:
                    pass
            break
    time.sleep(0.02)
sys.exit(int(any(node.wait() != 0 for node in nodes)))
"""
# Stand-in for scontrol: `show hostnames` (every emulated node is this machine); `requeue ID`
# noted in $SCONTROL_LOG.
SCONTROL = """#!/bin/bash
if [[ "$1" == requeue ]]; then echo "$*" >> "$SCONTROL_LOG"; exit 0; fi
for ((i = 0; i < SLURM_NNODES; i++)); do echo 127.0.0.1; done
"""


def test_batch_script_syntax():
    result = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_batch_script_asks_for_a_signal_and_a_requeue(tmp_path, monkeypatch):
    text = SBATCH.read_text()
    assert "#SBATCH --signal=USR1@90\n" in text and "#SBATCH --requeue\n" in text
    words = srun_command(text)
    torchrun = words.index("torchrun")
    script = words.index("scripts/train_gpt.py")
    assert HANDLED in words[torchrun:script], "torchrun must forward SIGUSR1 to its workers"
    assert not any(w.startswith("--max-restarts") for w in words[torchrun:script])
    # The agent kills workers still running after --shutdown-timeout: they must have time to save,
    # and be done before the time limit.
    shutdown = next(w for w in words[torchrun:script] if w.startswith("--shutdown-timeout="))
    assert 30 <= int(shutdown.split("=")[1]) < 90
    values = {"$STEPS": "2000", "$CHECKPOINT_EVERY": "200", "$OUT_DIR": tmp_path / "out", "$CKPT_DIR": tmp_path / "c"}
    # The script's arguments: up to `|| STATUS=$?`, without the --resume that a later run adds.
    rest = words[script + 1 : words.index("||")]
    args = [str(values.get(w, w)) for w in rest if not w.startswith("${RESUME")]
    assert not any("$" in a for a in args), args
    # Two nodes of 8 GPUs, as the #SBATCH lines ask.
    monkeypatch.setenv("WORLD_SIZE", "16")
    parsed = load_script("train_gpt.py").parse_args(args)  # exits (fails the test) on a bad argument
    assert parsed.parallel == "fsdp" and parsed.checkpoint_dir == tmp_path / "c" and parsed.checkpoint_every == 200


def sourced(function: str, *args) -> str:
    """A function of the batch script, sourced and called alone: its output."""
    result = subprocess.run(
        ["bash", "-c", f'source "$1" && shift && {function} "$@"', "bash", str(SBATCH), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def checkpoint(ckpt: Path, step: int, complete: bool = True):
    folder = ckpt / f"step-{step:06d}"
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"")
    if complete:
        (folder / ".metadata").write_bytes(b"")


def test_newest_step_counts_complete_checkpoints_only(tmp_path):
    ckpt = tmp_path / "ckpt"
    assert sourced("newest_step", ckpt) == "-1"
    ckpt.mkdir()
    assert sourced("newest_step", ckpt) == "-1"
    # 8 and 9 are no octal digits: the folder names are read in base 10.
    for step in (0, 9, 80):
        checkpoint(ckpt, step)
    checkpoint(ckpt, 120, complete=False)
    assert sourced("newest_step", ckpt) == "80"


@pytest.mark.parametrize(
    "metrics, steps, started_from, expected",
    [
        (True, [40], 20, "done"),
        (True, [], -1, "done"),
        (False, [20, 40], 20, "requeue"),
        (False, [10], -1, "requeue"),
        (False, [20], 20, "crash"),
        (False, [], -1, "crash"),
        # Step 40 is incomplete (no .metadata): a run killed while saving it.
        (False, [20, -40], 20, "crash"),
    ],
)
def test_the_decision_after_torchrun(tmp_path, metrics, steps, started_from, expected):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    ckpt.mkdir()
    if metrics:
        (out / "metrics.json").write_text("{}")
    for step in steps:
        checkpoint(ckpt, abs(step), complete=step >= 0)
    assert sourced("outcome", out, ckpt, started_from) == expected


def run_batch_script(env: dict, logs: Path, **extra: str) -> tuple[subprocess.CompletedProcess, str]:
    """One run of the job: the batch script's result, and its nodes' output."""
    logs.mkdir()
    result = run_bounded(["bash", str(SBATCH)], timeout=180, cwd=ROOT, env={**env, "SRUN_LOG_DIR": str(logs), **extra})
    return result, "".join(p.read_text() for p in sorted(logs.glob("node*.log")))


def test_a_preempted_job_is_requeued_and_resumes_on_two_emulated_nodes(tmp_path):
    bin_dir = stand_ins(tmp_path, srun=SRUN, scontrol=SCONTROL)
    port, job_id = free_port_for_job_id()
    ckpt, out, requeues = tmp_path / "ckpt", tmp_path / "out", tmp_path / "scontrol.log"
    env = emulated_job_environment(
        bin_dir, job_id, "train-gpt", SCONTROL_LOG=str(requeues), CKPT_DIR=str(ckpt), OUT_DIR=str(out), STEPS="30"
    )

    first, logs = run_batch_script(env, tmp_path / "run1", PREEMPT_WHEN="step 1/30:")
    report = first.stdout + first.stderr + logs[-3000:]
    assert first.returncode == 0, report
    assert f"rendezvous at 127.0.0.1:{port}, from step 0 of 30" in first.stdout, report
    preempted = [line for line in logs.splitlines() if line.startswith("preempted by SIGUSR1 after step ")]
    assert len(preempted) == 1, report
    step = int(preempted[0].split()[5])
    assert 0 < step < 30 and (ckpt / f"step-{step:06d}" / ".metadata").is_file(), report
    assert f"stopped after step {step}, saved in {ckpt}: requeued" in first.stdout, report
    assert requeues.read_text() == f"requeue {job_id}\n", report
    assert not (out / "metrics.json").exists()

    # The requeued job: the same id, a new run.
    second, logs = run_batch_script(env, tmp_path / "run2", SLURM_RESTART_COUNT="1")
    report = second.stdout + second.stderr + logs[-3000:]
    assert second.returncode == 0, report
    assert f"(run 2): 2 nodes x 1 processes, rendezvous at 127.0.0.1:{port}, from step {step} of 30" in second.stdout
    assert f"resumed from {ckpt / f'step-{step:06d}'} (step {step})" in logs, report
    assert f"trained 30 steps: {out / 'metrics.json'}" in second.stdout, report
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["start_step"] == step and len(metrics["losses"]) == 30 - step
    assert requeues.read_text() == f"requeue {job_id}\n", "requeued again"

    # Requeued once more (by hand, or after the last step): nothing left to train, nothing launched.
    third, logs = run_batch_script(env, tmp_path / "run3", SLURM_RESTART_COUNT="2")
    assert third.returncode == 0 and "already trained" in third.stdout and not logs, third.stdout + third.stderr
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
