"""scripts/train_ddp.py under faults (chapter 09): crashes, kills, hangs, bad checkpoints.

- a worker that crashes at a random step, or is SIGKILLed from outside at a random moment, under
  ``torchrun --max-restarts=1``: the job resumes from its checkpoint and its final weights equal
  the uninterrupted run's, bit for bit (``PARALLEL_COURSE_FAULT_TRIALS`` trials of each, default 2);
  the first crash trial runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (chapter 10: a fresh
  store every round, the script's plain ``init_process_group`` path), the others with torchrun's
  shared store, as the SIGKILL trials do;
- a hung rank: the others fail within the configured ``--timeout``;
- two jobs started at the same time on this machine both succeed (no port collision);
- a checkpoint folder that is a file, a truncated, corrupted or foreign checkpoint: one line on
  stderr, a non-zero exit, the checkpoint left as it was and no training from scratch;
- no process a test started outlives it.
"""

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from helpers import TORCHRUN, job_command, job_environment, launch, load_script, survivors
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_ddp.py"
# 4 epochs of 32 steps (global batch 32 of 1024 samples), a checkpoint every 5 steps
TRAIN = ["--epochs", "4", "--samples", "1024", "--global-batch-size", "32", "--seed", "3", "--checkpoint-every", "5"]
STEPS = 4 * 1024 // 32
TRIALS = int(os.environ.get("PARALLEL_COURSE_FAULT_TRIALS", "2"))
LAUNCH_TIMEOUT = 120  # s: a launch that takes longer is a hang, and is killed


def torchrun_cmd(*args, restarts=0):
    return [
        TORCHRUN,
        "--standalone",
        "--nproc_per_node=2",
        f"--max-restarts={restarts}",
        str(SCRIPT),
        *[str(a) for a in args],
    ]


def weights(out):
    return torch.load(Path(out) / "final.pt", map_location="cpu", weights_only=True)


def assert_bit_equal(reference, out, what):
    a, b = weights(reference), weights(out)
    assert a.keys() == b.keys()
    unequal = {k: (a[k] - b[k]).abs().max().item() for k in a if not torch.equal(a[k], b[k])}
    assert not unequal, f"{what}: final weights differ from the uninterrupted run: max |dW| {unequal}"


class Launch:
    """torchrun in a session of its own: watched, killed as a group, bounded in time."""

    def __init__(self, cmd, timeout=LAUNCH_TIMEOUT, **extra_env):
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=job_environment(**extra_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def workers(self):
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for c in children:
            try:
                if str(SCRIPT) in " ".join(c.cmdline()) and c.status() != psutil.STATUS_ZOMBIE:
                    alive.append(c)
            except psutil.NoSuchProcess:
                pass
        return alive

    def wait_for_workers(self, n=2):
        while time.monotonic() < self.deadline:
            found = self.workers()
            if len(found) >= n:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"{n} workers never appeared")

    def finish(self):
        try:
            out, err = self.proc.communicate(timeout=max(1, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"the job did not finish in time; stderr ends:\n{err[-2000:]}") from None
        finally:
            self.kill()
        return self.proc.returncode, out, err, time.monotonic() - self.start

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, and how long its workers trained (for choosing kill moments)."""
    base = tmp_path_factory.mktemp("reference")
    job = Launch(torchrun_cmd(*TRAIN, "--out", base / "out", "--checkpoint-dir", base / "ckpt"))
    job.wait_for_workers()
    seen = time.monotonic()
    rc, out, err, _ = job.finish()
    assert rc == 0, err[-3000:]
    return {"out": base / "out", "worker_seconds": time.monotonic() - seen}


def trial_rng():
    """A random generator for one trial, and its seed (set PARALLEL_COURSE_FAULT_SEED to replay one)."""
    seed = int(os.environ.get("PARALLEL_COURSE_FAULT_SEED", str(random.SystemRandom().randrange(10**6))))
    return random.Random(seed), seed


@pytest.mark.parametrize("trial", range(TRIALS))
def test_crash_at_a_random_step_resumes_exactly(reference, tmp_path, request, trial):
    rng, seed = trial_rng()
    step, rank = rng.randint(1, STEPS), rng.randint(0, 1)
    # torchrun gives every round a new store (as the cluster files set it): the workers are told
    # TORCHELASTIC_USE_AGENT_STORE=False and join plainly.
    fresh_store = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if trial == 0 else {}
    store = "a fresh store every round" if fresh_store else "torchrun's shared store"
    print(f"\n{request.node.name}: crash of rank {rank} in step {step} of {STEPS}, {store} (seed {seed})")
    job = Launch(
        torchrun_cmd(
            *TRAIN,
            "--out",
            tmp_path / "out",
            "--checkpoint-dir",
            tmp_path / "ckpt",
            "--fail-at-step",
            step,
            "--fail-rank",
            rank,
            restarts=1,
        ),
        **fresh_store,
    )
    rc, out, err, _ = job.finish()
    what = f"crash of rank {rank} in step {step}, {store} (seed {seed})"
    assert rc == 0, f"{what}: torchrun exited {rc}:\n{err[-3000:]}"
    assert f"injected failure: rank {rank} in step {step}" in err, what
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["restarts"] == 1 and metrics["steps"] == STEPS, metrics
    assert_bit_equal(reference["out"], tmp_path / "out", what)
    assert not survivors(str(tmp_path)), "processes outlived the job"


@pytest.mark.parametrize("trial", range(TRIALS))
def test_sigkill_at_a_random_moment_resumes_exactly(reference, tmp_path, request, trial):
    rng, seed = trial_rng()
    delay = rng.uniform(0, 0.8 * reference["worker_seconds"])
    for attempt in range(4):  # a kill that comes after the workers finished tests nothing: sooner
        out = tmp_path / f"try{attempt}"
        job = Launch(torchrun_cmd(*TRAIN, "--out", out / "out", "--checkpoint-dir", out / "ckpt", restarts=1))
        workers = job.wait_for_workers()
        time.sleep(delay)
        victim = rng.choice(workers)
        try:
            who = f"rank {victim.environ().get('RANK', '?')}"
            victim.send_signal(signal.SIGKILL)
            break
        except psutil.NoSuchProcess:
            job.finish()
            delay /= 2
    else:
        pytest.fail("the workers always finished before the kill")
    print(
        f"\n{request.node.name}: SIGKILL of {who} {delay:.2f} s after the workers started "
        f"(the reference's trained for {reference['worker_seconds']:.1f} s; seed {seed})"
    )
    rc, _, err, _ = job.finish()
    what = f"SIGKILL of {who} {delay:.2f} s after the workers started (seed {seed})"
    assert rc == 0, f"{what}: torchrun exited {rc}:\n{err[-3000:]}"
    metrics = json.loads((out / "out" / "metrics.json").read_text())
    assert metrics["restarts"] == 1, f"{what}: the job was not restarted: {metrics}"
    assert_bit_equal(reference["out"], out / "out", what)
    assert not survivors(str(tmp_path)), "processes outlived the job"


def test_a_hung_rank_is_an_error_within_the_timeout(tmp_path):
    timeout = 3
    job = Launch(
        torchrun_cmd(
            *TRAIN,
            "--out",
            tmp_path / "out",
            "--timeout",
            timeout,
            "--fail-at-step",
            3,
            "--fail-rank",
            1,
            "--fail-how",
            "hang",
        )
    )
    job.wait_for_workers()
    started = time.monotonic()
    rc, out, err, _ = job.finish()
    seconds = time.monotonic() - started
    assert rc != 0, "a hung rank must fail the job"
    timed_out = (
        f"Timed out waiting {timeout * 1000}ms",  # gloo: the other rank's collective
        "Watchdog caught collective operation timeout",
    )  # nccl (a GPU per process)
    assert any(words in err for words in timed_out), err[-3000:]
    # The hung rank gives up by itself only after 10 x timeout: the job ended before, by the timeout.
    assert seconds < 10 * timeout, f"the job took {seconds:.1f} s to fail"
    assert not survivors(str(tmp_path)), "processes outlived the job"


def test_two_jobs_at_once_do_not_collide(tmp_path):
    results = {}

    def run(name):
        results[name] = run_bounded(
            torchrun_cmd(*TRAIN, "--epochs", 1, "--out", tmp_path / name),
            timeout=LAUNCH_TIMEOUT,
            cwd=ROOT,
            env=job_environment(),
        )

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, result in results.items():
        assert result.returncode == 0, f"job {name}:\n{result.stderr[-3000:]}"
    assert_bit_equal(tmp_path / "a", tmp_path / "b", "two identical jobs at once")


def python_run(*args):
    return launch(job_command(SCRIPT, None, *args), timeout=LAUNCH_TIMEOUT)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real checkpoint of a short single-process run, stopped by a crash after step 5."""
    base = tmp_path_factory.mktemp("ckpt")
    args = ["--epochs", "1", "--samples", "256", "--global-batch-size", "32", "--checkpoint-every", "5"]
    result = python_run(*args, "--out", base / "out", "--checkpoint-dir", base / "ckpt", "--fail-at-step", 7)
    assert result.returncode != 0 and "injected failure" in result.stderr
    return base / "ckpt" / "last.pt", args


def one_line_error(result, *words):
    """One error line, the last on stderr (argparse may print its usage before it); no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) == 1 and lines[-1] == errors[0], f"expected one error line, got:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in errors[0], errors[0]


def damaged(good: Path, damage: str, ckpt_dir: Path) -> bytes:
    """``good``'s bytes, damaged so (a foreign checkpoint is a good one of another run: the seed
    differs), written as ``ckpt_dir``/last.pt."""
    data = good.read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "corrupted":
        data = bytes(b ^ 0x5A for b in data)
    ckpt_dir.mkdir()
    (ckpt_dir / "last.pt").write_bytes(data)
    return data


def test_a_bad_checkpoint_is_a_one_line_error(checkpoint, tmp_path):
    """The command line, launched: one line, nothing written, no training. Every kind of damage
    goes through the one check before training, in this process below."""
    good, args = checkpoint
    data = damaged(good, "truncated", tmp_path / "ckpt")
    result = python_run(*args, "--out", tmp_path / "out", "--checkpoint-dir", tmp_path / "ckpt")
    one_line_error(result, "checkpoint", "last.pt")
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == data, "the checkpoint was changed"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.pt"], "a new checkpoint was written"
    assert not (tmp_path / "out" / "final.pt").exists(), "it trained from scratch"


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "foreign"])
def test_every_bad_checkpoint_is_refused_in_one_line(train_ddp, checkpoint, tmp_path, monkeypatch, damage):
    good, args = checkpoint
    data = damaged(good, damage, tmp_path / "ckpt")
    seed = ["--seed", "99"] if damage == "foreign" else []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    parsed = train_ddp.parse_args(
        [*args, *seed, "--out", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    )
    with pytest.raises(SystemExit) as exit_info:
        train_ddp.load_checkpoint(parsed, torch.device("cpu"))
    message = str(exit_info.value.code)
    assert message.startswith("train_ddp.py: error: ") and "\n" not in message, message
    assert "checkpoint" in message and "last.pt" in message, message
    assert (tmp_path / "ckpt" / "last.pt").read_bytes() == data, "the checkpoint was changed"


@pytest.fixture(scope="module")
def train_ddp():
    """The script as a module: its argument checks run in this process, no launch (the command
    line's one-line error and exit code 2 are checked once, in test_train_ddp.py)."""
    return load_script(SCRIPT)


@pytest.mark.parametrize(
    "bad",
    [
        ["--checkpoint-every", "0"],
        ["--timeout", "0"],
        ["--fail-at-step", "0"],
        ["--fail-at-step", "3", "--fail-rank", "1"],
        ["CHECKPOINT_DIR_IS_A_FILE"],
    ],
)
def test_bad_fault_arguments_are_one_line_errors(train_ddp, tmp_path, monkeypatch, capsys, bad):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if bad == ["CHECKPOINT_DIR_IS_A_FILE"]:
        (tmp_path / "ckpt").write_text("not a folder")
        bad = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    with pytest.raises(SystemExit) as exit_info:
        train_ddp.parse_args(["--out", str(tmp_path / "out"), *bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert sum("error" in line for line in err) == 1 and "error: " in err[-1], err
    if bad[0] == "--checkpoint-dir":
        assert "--checkpoint-dir" in err[-1]
    assert not (tmp_path / "out").exists()


def test_resume_from_a_checkpoint_continues_where_it_stopped(checkpoint, tmp_path):
    good, args = checkpoint
    reference = python_run(*args, "--out", tmp_path / "ref")
    assert reference.returncode == 0, reference.stderr
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    (ckpt_dir / "last.pt").write_bytes(good.read_bytes())
    resumed = python_run(*args, "--out", tmp_path / "out", "--checkpoint-dir", ckpt_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 5" in resumed.stdout, resumed.stdout
    assert_bit_equal(tmp_path / "ref", tmp_path / "out", "a plain-python resume")
