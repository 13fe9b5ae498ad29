"""Lab 09 (resume exactly after a crash): the likely slips, recognised from what the student's
checkpoint code produced.

In the kernel (check 1, a group of one): the step not returned, the model's, the optimizer's or
the scheduler's state not saved and loaded, the RNG not set back, a save that overwrites the old
checkpoint in place (``step_slip``, ``weights_slip``, ``moments_slip``, ``schedule_slip``,
``rng_slip``, ``failed_save_slip``; ``check_named`` puts the slip in the FAIL line); a save watched
line by line (``what_path_held``): the old file removed before the new one takes its place, or the
new one written (or copied) into the checkpoint's own path (``save_slip``).

After a crash and a restart (check 2): the job logs a fingerprint of each rank's state after every
checkpoint and after a restore (``log_fingerprint``); ``restart_slip`` compares, rank by rank, what
the restart brought back with what was saved: weights, optimizer state, schedule, the RNG (another
rank's: only one rank's state saved), the GPU's generator.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parallel_course.checks import CheckFailed, check_equal


def check_named(what: str, got: Any, expected: Any, slip: str | None) -> None:
    """check_equal, its FAIL line ending with ``slip`` (the likely slip) when there is one."""
    try:
        check_equal(what, got, expected)
    except CheckFailed as failed:
        raise CheckFailed(f"{failed}: {slip}" if slip else str(failed)) from None


# --- check 1: in the kernel ----------------------------------------------------------------------


def step_slip(got: Any, saved: int) -> str | None:
    if got == saved:
        return None
    if got is None:
        return "restore returned nothing: it returns the step the checkpoint was taken after"
    return f"restore returned {got!r}, the checkpoint was taken after step {saved}: is it the step saved in it?"


def weights_slip(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> str | None:
    """The fresh model's weights ``before`` and ``after`` restore."""
    if all(torch.equal(a, b) for a, b in zip(before, after)):
        return "restore left the fresh model's weights as they were: is the model's state saved and loaded back?"
    return None


def moments_slip(n_states: int) -> str | None:
    """``n_states``: how many parameters have optimizer state in the restored optimizer."""
    if n_states == 0:
        return "the restored optimizer has no state at all: is the optimizer's state saved and loaded back?"
    return None


def schedule_slip(got: list[float], saved: list[float], first: list[float]) -> str | None:
    """Learning rates: ``got`` after restore, ``saved`` at the save, ``first`` the schedule's first."""
    if got != saved and got == first:
        return "the schedule starts over: is the scheduler's state saved and loaded back?"
    return None


def rng_slip(now: torch.Tensor, saved: torch.Tensor, moved_on: torch.Tensor) -> str | None:
    """RNG states: ``now`` after restore, ``saved`` at the save, ``moved_on`` just before restore."""
    if torch.equal(now, saved):
        return None
    if torch.equal(now, moved_on):
        return "restore left the RNG where it was: is its state saved and set back?"
    return "the RNG was set to a state other than the one it had at the save"


def failed_save_slip(path: Path) -> str | None:
    """After a save into ``path`` failed half-way: what is left of the previous checkpoint."""
    if not path.exists():
        return "the previous checkpoint is gone"
    try:
        torch.load(path, weights_only=True)
    except Exception:
        return (
            "the failed save left a file torch.load cannot read: does save_atomically write over the old "
            "checkpoint directly?"
        )
    return None


OLD, NEW, NO_FILE = "the old file", "the new file", "no file"


def what_path_held(save, state: Any, path: Path) -> list[str]:
    """``save(state, path)``, with ``path`` read before every line of Python that runs (the save's own
    and what it calls: torch.save's, shutil's, pathlib's) and once after: what it held, in order,
    each change once: the old file, the new file (what it holds at the end), no file, or a file of
    N bytes that is neither. Lines counted, not timed: what a crash between two of them would leave."""

    def read() -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    old, held = read(), []

    def look(frame, event, arg):
        content = read()
        if not held or held[-1] != content:
            held.append(content)
        return look

    previous = sys.gettrace()
    sys.settrace(look)
    try:
        save(state, path)
    finally:
        sys.settrace(previous)
    look(None, "end", None)
    new = held[-1]

    def named(content: bytes | None) -> str:
        if content is None:
            return NO_FILE
        if content == old:
            return OLD
        if content == new:
            return NEW
        return f"a file of {len(content):,} bytes"

    return [named(content) for content in held]


def save_slip(held: Sequence[str]) -> str | None:
    """What ``what_path_held`` saw points to: the old file removed first, or a partial file in the
    checkpoint's own path; None when it held only the old file, then the new one."""
    if NO_FILE in held[1:-1]:
        return (
            "for a while there was no checkpoint at all: is the old file removed before the new one takes its "
            "place? os.replace(tmp, path) replaces it in one step"
        )
    if any(h not in (OLD, NEW) for h in held):
        return (
            "the checkpoint's own path held a partial file: is the new one written (or copied) into it? Write a "
            "temporary file, then os.replace it over the old one"
        )
    return None


# --- check 2: fingerprints of a job that crashed and was restarted -------------------------------


def _digest(value: Any, h) -> None:
    if isinstance(value, torch.Tensor):
        h.update(str((value.dtype, tuple(value.shape))).encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            _digest(value[key], h)
    elif isinstance(value, list | tuple):
        for item in value:
            _digest(item, h)
    else:
        h.update(repr(value).encode())


def digest(value: Any) -> str:
    """A short digest of tensors (bit for bit), dicts, lists and numbers."""
    h = hashlib.sha256()
    _digest(value, h)
    return h.hexdigest()[:16]


def fingerprint(model, optimizer, scheduler) -> dict[str, Any]:
    """What a restart must bring back on this rank, each part as a digest (the learning rates as
    they are): weights, optimizer state, schedule, the CPU's RNG and the GPU's where the model is."""
    cuda = next(model.parameters()).is_cuda
    return {
        "weights": digest(model.state_dict()),
        "optimizer": digest(optimizer.state_dict()["state"]),
        "schedule": digest(scheduler.state_dict()),
        "lr": [group["lr"] for group in optimizer.param_groups],
        "rng": digest(torch.get_rng_state()),
        "cuda_rng": digest(torch.cuda.get_rng_state()) if cuda else None,
    }


def log_fingerprint(folder: Path, event: str, step: int, model, optimizer, scheduler, attempt: int) -> None:
    """Append this rank's fingerprint after ``event`` ("saved" or "restored") at ``step`` to
    folder/fingerprints.rank<R>.jsonl."""
    rank = dist.get_rank()
    record = {"rank": rank, "attempt": attempt, "event": event, "step": step}
    record.update(fingerprint(model, optimizer, scheduler))
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"fingerprints.rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def read_fingerprints(folder: Path) -> list[dict]:
    """Every record the ranks logged in ``folder``."""
    return [json.loads(line) for path in sorted(Path(folder).glob("fingerprints.rank*.jsonl")) for line in open(path)]


def _restart_problems(restored: dict, saved: dict, saved_by_rank: dict[int, dict]) -> list[str]:
    """What differs between a rank's state after the restart and the one it saved."""
    rank, step = restored["rank"], restored["step"]
    problems = []
    if restored["weights"] != saved["weights"]:
        problems.append(f"rank {rank}'s weights after the restart are not those it had after step {step}")
    if restored["optimizer"] != saved["optimizer"]:
        problems.append(f"rank {rank}'s optimizer state (Adam's moments) is not the one it had after step {step}")
    if restored["schedule"] != saved["schedule"]:
        problems.append(f"rank {rank}'s learning-rate schedule is not where it was after step {step}")
    for key, generator in (("rng", "RNG"), ("cuda_rng", "GPU's generator")):
        if restored[key] == saved[key]:
            continue
        donors = [r for r, record in saved_by_rank.items() if r != rank and record[key] == restored[key]]
        if donors:
            problems.append(
                f"rank {rank} resumed with rank {donors[0]}'s {generator} state: every rank draws its own "
                "dropout masks, so each needs its own state back"
            )
        else:
            problems.append(
                f"rank {rank}'s {generator} state is not the one it had after step {step}: is it saved and set back?"
            )
    return problems


def restart_slip(records: Sequence[dict]) -> str | None:
    """What a restart failed to bring back, from the fingerprints a job logged (``read_fingerprints``):
    rank by rank, its state after the restore against the one it logged when the checkpoint it
    resumed from was saved. None if nothing differs (or nothing was logged)."""
    restores = [r for r in records if r["event"] == "restored"]
    if not records:
        return None
    if not restores:
        return "no restarted attempt resumed from a checkpoint: is a checkpoint saved where the job looks for it?"
    problems = []
    for restored in sorted(restores, key=lambda r: (r["attempt"], r["rank"])):
        step, attempt = restored["step"], restored["attempt"]
        saved_then = {
            r["rank"]: r for r in records if r["event"] == "saved" and r["step"] == step and r["attempt"] < attempt
        }
        if restored["rank"] not in saved_then:
            problems.append(
                f"rank {restored['rank']} resumed after step {step}, but no checkpoint was saved after step {step}"
            )
            continue
        problems += _restart_problems(restored, saved_then[restored["rank"]], saved_then)
    return "; ".join(problems) if problems else None
