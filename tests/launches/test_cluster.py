"""scripts/cluster/: the SLURM batch script and the Kubernetes manifest (chapter 10).

No cluster here, so:
- the batch script passes ``bash -n``, takes the first node's name without breaking a slow
  ``scontrol`` (SIGPIPE under ``pipefail``), and runs end to end with stand-ins for ``srun`` and
  ``scontrol``: two emulated nodes on this machine (one torchrun agent each, c10d rendezvous,
  CPU and gloo: the nodes share this machine's GPUs, if any, so they are hidden), training
  ``scripts/train_ddp.py`` to the weights a one-process run reaches;
- both files give every rendezvous round a fresh store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``),
  which restarts on several nodes need;
- the manifest parses; both pods run the same torchrun command, the one the course teaches; its
  script arguments are accepted by ``train_ddp.py``; GPUs requested = processes per node;
  checkpoints go to a shared volume.
"""

import os
import re
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from helpers import load_script
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "cluster"
SBATCH = CLUSTER / "train_ddp.sbatch"
MANIFEST = CLUSTER / "pytorchjob.yaml"

SRUN = """#!/bin/bash
# Stand-in for srun: start the command once per node (one task per node), wait for all.
while [[ "$1" == --* ]]; do shift; done  # srun's own options
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_NODEID=$i SLURM_PROCID=$i "$@" > "$SRUN_LOG_DIR/node$i.log" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
"""
SCONTROL = """#!/bin/bash
# Stand-in for `scontrol show hostnames`: every emulated node is this machine.
for ((i = 0; i < SLURM_NNODES; i++)); do echo 127.0.0.1; done
"""


@pytest.fixture(scope="module")
def train_ddp():
    return load_script("train_ddp.py")


def test_batch_script_syntax():
    result = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def srun_command(text):
    """The srun ... torchrun ... command of the batch script, as a list of words."""
    joined = re.sub(r"\\\n\s*", " ", text)
    line = next(text for text in joined.splitlines() if text.lstrip().startswith("srun "))
    return shlex.split(line)


def test_batch_script_runs_the_course_command():
    words = srun_command(SBATCH.read_text())
    torchrun = words.index("torchrun")
    options = words[torchrun + 1 : words.index("scripts/train_ddp.py")]
    assert "--rdzv-backend=c10d" in options
    assert any(o.startswith("--rdzv-endpoint=$HEAD_NODE:$RDZV_PORT") for o in options)
    assert any(o.startswith("--max-restarts=") for o in options), "a crash should restart the job"
    assert any(o.startswith("--nnodes=$SLURM_NNODES") for o in options)
    assert not any(re.search(r"port=\d", o) or re.search(r":\d{4,5}$", o) for o in options), "a fixed port"
    assert "--checkpoint-dir" in words
    assert re.search(r"(?m)^export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1$", SBATCH.read_text()), (
        "restarts on several nodes need a fresh store every rendezvous round"
    )


def stand_ins(tmp_path, **scripts):
    """A folder of executable stand-ins (name -> script text) to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IXUSR)
    return bin_dir


# A scontrol that takes its time between names, as one listing a large allocation may: a reader that
# stops after the first name (`| head -n 1`) kills it with SIGPIPE, which pipefail makes fatal.
SLOW_SCONTROL = """#!/bin/bash
echo node-a; sleep 0.5; echo node-b; echo node-c
"""


def test_batch_script_takes_the_first_node_without_killing_scontrol(tmp_path):
    bin_dir = stand_ins(tmp_path, srun="#!/bin/bash\necho srun started\n", scontrol=SLOW_SCONTROL)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_NNODES="3")
    env.update(
        SLURM_JOB_NODELIST="node-[a-c]", SLURM_JOB_NAME="train-ddp", CKPT_DIR=str(tmp_path), OUT_DIR=str(tmp_path)
    )
    result = run_bounded(["bash", str(SBATCH)], timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "3 nodes x 8 processes, rendezvous at node-a:20007" in result.stdout and "srun started" in result.stdout


def free_port_for_job_id():
    """A free port p in [20000, 40000) and a job id for which the batch script derives p."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if 20000 <= port < 40000:
            return port, 7 * 20000 + (port - 20000)
    for port in range(39999, 20000, -1):  # the OS hands out ports above 40000 only: look below
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port, 7 * 20000 + (port - 20000)
    pytest.skip("no free port between 20000 and 40000")


def emulated_job_environment(bin_dir: Path, job_id: int, name: str, **extra: str) -> dict[str, str]:
    """What SLURM sets for a job on two nodes (node1, node2), with the stand-ins first on PATH, no
    launcher's variables from this process, and on the CPU: the emulated nodes would share
    cuda:0, which nccl refuses."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "LOCAL_", "WORLD_SIZE", "MASTER_", "TORCHELASTIC", "SLURM_"))
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        SLURM_JOB_ID=str(job_id),
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_JOB_NAME=name,
        SLURM_GPUS_ON_NODE="1",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        **extra,
    )
    return env


def test_batch_script_runs_end_to_end_on_two_emulated_nodes(tmp_path, train_ddp):
    bin_dir = stand_ins(tmp_path, srun=SRUN, scontrol=SCONTROL)
    port, job_id = free_port_for_job_id()
    env = emulated_job_environment(
        bin_dir,
        job_id,
        "train-ddp",
        SRUN_LOG_DIR=str(tmp_path),
        CKPT_DIR=str(tmp_path / "ckpt"),
        OUT_DIR=str(tmp_path / "out"),
    )
    result = run_bounded(["bash", str(SBATCH)], timeout=120, cwd=ROOT, env=env)
    logs = "".join((tmp_path / f"node{i}.log").read_text() for i in range(2) if (tmp_path / f"node{i}.log").exists())
    assert result.returncode == 0, result.stdout + result.stderr + logs[-3000:]
    assert f"rendezvous at 127.0.0.1:{port}" in result.stdout
    assert "world_size=2" in logs and "2 of 2 ranks reloaded it" in logs
    assert (tmp_path / "ckpt" / "last.pt").exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]

    # The same training in one process, without SLURM: the same weights (up to summation order).
    words = srun_command(SBATCH.read_text())
    rest = words[words.index("scripts/train_ddp.py") + 1 :]
    train_args = [
        w
        for i, w in enumerate(rest)  # without the flags whose values come from SLURM
        if not w.startswith("$") and not (i + 1 < len(rest) and rest[i + 1].startswith("$"))
    ]
    one = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_ddp.py"), *train_args, "--out", str(tmp_path / "one")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PATH": os.environ["PATH"]},
    )
    assert one.returncode == 0, one.stderr
    a = torch.load(tmp_path / "out" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "one" / "final.pt", weights_only=True)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5


@pytest.fixture(scope="module")
def job():
    return yaml.safe_load(MANIFEST.read_text())


def containers(job):
    specs = job["spec"]["pytorchReplicaSpecs"]
    return {role: spec["template"]["spec"]["containers"][0] for role, spec in specs.items()}


def option(args, name):
    return next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))


def test_manifest_is_a_pytorchjob_with_master_and_workers(job):
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    pods = sum(spec["replicas"] for spec in specs.values())
    for c in containers(job).values():
        assert int(option(c["args"], "--nnodes")) == pods, "--nnodes must equal the number of pods"


def test_every_pod_runs_the_same_course_command(job, train_ddp, monkeypatch):
    master, worker = containers(job)["Master"], containers(job)["Worker"]
    assert master["command"] == worker["command"] == ["torchrun"]
    assert master["args"] == worker["args"]
    args = master["args"]
    assert option(args, "--rdzv-backend") == "c10d"
    assert option(args, "--rdzv-endpoint") == "$(MASTER_ADDR):$(MASTER_PORT)", "the operator's address, no fixed port"
    assert int(option(args, "--max-restarts")) >= 1
    script = args.index("scripts/train_ddp.py")
    world_size = int(option(args, "--nnodes")) * int(option(args, "--nproc_per_node"))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    parsed = train_ddp.parse_args(args[script + 1 :])  # exits (fails the test) on an unknown flag
    assert parsed.checkpoint_dir is not None


def test_fresh_store_every_round(job):
    for role, c in containers(job).items():
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1", role


def test_gpus_volumes_and_shared_checkpoints(job):
    for role, c in containers(job).items():
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == int(option(c["args"], "--nproc_per_node")), role
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        ckpt = option(c["args"], "--checkpoint-dir")
        mount = next(p for p in mounts if ckpt.startswith(p + "/"))
        volumes = {v["name"]: v for v in job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["volumes"]}
        assert "persistentVolumeClaim" in volumes[mounts[mount]], "checkpoints on a volume every pod shares"
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
