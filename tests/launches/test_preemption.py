"""scripts/train_gpt.py preempted: SIGTERM or SIGUSR1 at a random moment while it trains.

A scheduler warns a job before it stops it (SLURM: ``scancel --signal``, ``#SBATCH --signal``) by
signalling every process of the job: the launcher and each worker. Here ``torchrun`` (told to handle
SIGUSR1 too, as scripts/cluster/train_gpt.sbatch runs it) and its two ddp workers get the signal
the same way, at a random moment after the first step:

- the workers finish the step they are in, save it, and exit; torchrun exits non-zero; rank 0
  names the signal and the step N (0 < N < M); DIR/step-N is a complete checkpoint; the job ends
  within a bound; no process is left;
- ``--resume DIR`` on the same layout continues to step M: its losses equal the uninterrupted
  run's from step N on, bit for bit;
- the uninterrupted run, with ``--checkpoint-every`` above ``--steps``, saves once, at the end.

The moment is drawn afresh every run; the test's output names it with the seed that replays it
(``PARALLEL_COURSE_FAULT_SEED``).
"""

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from helpers import TORCHRUN, job_environment, launch, survivors

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_gpt.py"
STEPS = 150
TRAIN = ["--parallel", "ddp", "--steps", STEPS, "--seed", "5", "--global-batch-size", "16", "--variable-length"]
# torchrun's agent forwards only the signals it handles; SIGUSR1 is not among them by default (it
# would kill the agent at once and leave the workers running).
HANDLED = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
LAUNCH_TIMEOUT = 120  # s: a launch that takes longer is a hang, and is killed
# From the signal to torchrun's exit: finishing one step and saving takes a few seconds. Generous,
# so that a busy machine does not fail it, and below the 30 s after which torchrun's agent kills
# workers that have not exited.
EXIT_BOUND_S = 25
PREEMPTED = re.compile(r"preempted by (\w+) after step (\d+) of (\d+): saved (\S+); continue with --resume (\S+)")


def torchrun_cmd(*args):
    return [TORCHRUN, "--standalone", "--nproc_per_node=2", HANDLED, str(SCRIPT), *map(str, [*TRAIN, *args])]


def complete(checkpoint: Path) -> bool:
    """torch.distributed.checkpoint writes .metadata last, once every rank has written its part."""
    return (checkpoint / ".metadata").is_file()


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Job:
    """torchrun in a session of its own, its output in files (read while it runs): watched,
    signalled, bounded in time, and killed with its workers whatever happens."""

    def __init__(self, cmd, folder: Path, timeout=LAUNCH_TIMEOUT):
        folder.mkdir(parents=True)
        self.stdout, self.stderr = folder / "stdout.txt", folder / "stderr.txt"
        self.deadline = time.monotonic() + timeout
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=job_environment(), stdout=out, stderr=err, start_new_session=True
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def output(self) -> str:
        return self.stdout.read_text()

    def wait_for(self, text: str) -> float:
        """The moment ``text`` appeared on the job's stdout; fails if the job ended or ran out of time first."""
        while time.monotonic() < self.deadline:
            if text in self.output():
                return time.monotonic()
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        pytest.fail(f"{text!r} never appeared; stdout:\n{self.output()[-2000:]}\nstderr:\n{self.errors()}")

    def errors(self) -> str:
        return self.stderr.read_text()[-3000:]

    def workers(self) -> list:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for c in children:
            try:
                if str(SCRIPT) in " ".join(c.cmdline()):
                    found.append(c)
            except psutil.NoSuchProcess:
                pass
        return found

    def signal_as_slurm_does(self, sig: signal.Signals) -> list:
        """``sig`` to torchrun's process group and to each worker (they run in sessions of their
        own): what SLURM does to every process of a job step. Returns the workers signalled."""
        workers = self.workers()
        os.killpg(self.proc.pid, sig)
        for w in workers:
            try:
                w.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        return workers

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=max(1, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job did not finish in time; stderr ends:\n{self.errors()}")

    def kill(self):
        """torchrun and its workers, which a kill of its group alone would not reach."""
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in descendants:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait()


def losses(out: Path) -> tuple[list[float], dict]:
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["losses"], metrics


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, its losses, and how long its steps took (to draw signal moments from).
    It checkpoints every STEPS + 1 steps: only at the end."""
    base = tmp_path_factory.mktemp("reference")
    with Job(
        torchrun_cmd("--out", base / "out", "--checkpoint-dir", base / "ckpt", "--checkpoint-every", STEPS + 1),
        base / "log",
    ) as job:
        first = job.wait_for(f"step 1/{STEPS}:")
        last = job.wait_for(f"step {STEPS}/{STEPS}:")
        rc = job.finish()
    assert rc == 0, job.errors()
    found, metrics = losses(base / "out")
    assert len(found) == STEPS and metrics["start_step"] == 0
    return {"losses": found, "ckpt": base / "ckpt", "train_seconds": last - first}


def test_checkpoint_every_above_steps_saves_at_the_end_only(reference):
    ckpt = reference["ckpt"]
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step-{STEPS:06d}"]
    assert complete(ckpt / f"step-{STEPS:06d}")


def trial_rng():
    """A random generator for one trial, and its seed (set PARALLEL_COURSE_FAULT_SEED to replay one)."""
    seed = int(os.environ.get("PARALLEL_COURSE_FAULT_SEED", str(random.SystemRandom().randrange(10**6))))
    return random.Random(seed), seed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_signal_at_a_random_moment_saves_and_resumes_exactly(reference, tmp_path, request, sig):
    rng, seed = trial_rng()
    # Well inside the run: a signal after the last step tests nothing.
    delay = rng.uniform(0, 0.5 * reference["train_seconds"])
    print(f"\n{request.node.name}: {sig.name} {delay:.2f} s after step 1 (seed {seed})")
    for attempt in range(4):
        ckpt, out = tmp_path / f"try{attempt}" / "ckpt", tmp_path / f"try{attempt}" / "out"
        with Job(torchrun_cmd("--out", out, "--checkpoint-dir", ckpt), tmp_path / f"try{attempt}" / "log") as job:
            job.wait_for(f"step 1/{STEPS}:")
            time.sleep(delay)
            workers = job.signal_as_slurm_does(sig)
            signalled = time.monotonic()
            rc = job.finish()
            seconds = time.monotonic() - signalled
            stdout = job.output()
            found = PREEMPTED.search(stdout)
            # A machine faster than during the reference may have run every step first: sooner.
            if found and int(found.group(2)) < STEPS:
                break
            if found is None and f"step {STEPS}/{STEPS}" not in stdout:
                break
        delay /= 2
    else:
        pytest.fail(
            f"{sig.name}: the job always reached step {STEPS} (the signal came too late, or was ignored; seed {seed})"
        )
    what = (
        f"{sig.name} {delay:.2f} s after step 1 (the reference's steps took {reference['train_seconds']:.1f} s; "
        f"seed {seed})"
    )
    errors = job.errors()
    assert rc != 0, f"{what}: torchrun exited 0 after a signal:\n{errors}"
    assert len(workers) == 2, f"{what}: signalled {len(workers)} workers"
    assert found, f"{what}: no preemption message; stdout:\n{stdout[-2000:]}\nstderr:\n{errors}"
    name, step, steps = found.group(1), int(found.group(2)), int(found.group(3))
    assert name == sig.name and steps == STEPS and 0 < step < STEPS, f"{what}: {found.group(0)}"
    saved = ckpt / f"step-{step:06d}"
    assert found.group(4) == str(saved) and found.group(5) == str(ckpt), f"{what}: {found.group(0)}"
    assert complete(saved), f"{what}: {saved} is incomplete: {sorted(p.name for p in saved.iterdir())}"
    assert seconds < EXIT_BOUND_S, f"{what}: torchrun exited {seconds:.1f} s after the signal"
    assert not any(alive(w) for w in workers), f"{what}: a worker outlived torchrun"
    assert not survivors(str(tmp_path)), f"{what}: processes outlived the job"
    assert not (out / "metrics.json").exists(), f"{what}: a preempted run wrote its metrics"

    resumed = launch(torchrun_cmd("--out", tmp_path / "resumed", "--resume", ckpt), timeout=LAUNCH_TIMEOUT)
    assert resumed.returncode == 0, f"{what}: the resumed run failed:\n{resumed.stderr[-3000:]}"
    assert f"resumed from {saved} (step {step})" in resumed.stdout, resumed.stdout
    found_losses, metrics = losses(tmp_path / "resumed")
    assert metrics["start_step"] == step
    # Exact: the same weights, optimizer state and data position as the uninterrupted run's at step N.
    assert found_losses == reference["losses"][step:], f"{what}: the resumed losses differ from the uninterrupted run's"
    assert not survivors(str(tmp_path)), f"{what}: processes outlived the resumed job"
    trial = f"{what}: saved step {step} of {STEPS}, torchrun exited {seconds:.1f} s after the signal"
    print(f"{request.node.name}: {trial}")
    request.node.user_properties.append(("trial", trial))
