"""Lab 09's slip recognition (parallel_course.slips.resume): check 1's slips from what restore
left, check 2's from the fingerprints a job logged; nothing named where there is no pattern. The
slips the checks name for the solution with each slip injected: tests/course/test_slips_lab09_check1.py
(check 1), tests/launches/test_slips_lab09.py (check 2: every rank resumed with rank 0's RNG)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from parallel_course.checks import CheckFailed
from parallel_course.slips import resume
from parallel_course.slips.resume import (
    check_named,
    digest,
    failed_save_slip,
    moments_slip,
    read_fingerprints,
    restart_slip,
    rng_slip,
    schedule_slip,
    step_slip,
    weights_slip,
)


def test_check_named(capsys):
    check_named("step", 3, 3, "never shown")
    assert capsys.readouterr().out == "PASS step: 3\n"
    with pytest.raises(CheckFailed, match=r"^FAIL step: expected 3, got 4: the slip$"):
        check_named("step", 4, 3, "the slip")
    with pytest.raises(CheckFailed, match=r"^FAIL step: expected 3, got 4$"):
        check_named("step", 4, 3, None)


def test_check_1_silent_on_a_right_restore():
    assert step_slip(3, 3) is None
    assert weights_slip([torch.ones(2)], [torch.zeros(2)]) is None
    assert moments_slip(3) is None
    assert schedule_slip([0.0025], [0.005], [0.01]) is None
    saved, moved = torch.get_rng_state(), torch.get_rng_state().flip(0)
    assert rng_slip(saved.clone(), saved, moved) is None


def test_check_1_slips_no_injection_makes():
    # (nothing returned, weights, moments, schedule and RNG not restored: the injected slips)
    assert step_slip(4, 3).startswith("restore returned 4, the checkpoint was taken after step 3")
    saved, moved = torch.get_rng_state(), torch.get_rng_state().flip(0)
    assert rng_slip(torch.zeros_like(saved), saved, moved).startswith("the RNG was set to a state other than")


def test_what_a_failed_save_left(tmp_path):
    # No injected slip gets here: a save into the checkpoint's own path fails the watched save first.
    path = tmp_path / "last.pt"
    assert failed_save_slip(path) == "the previous checkpoint is gone"
    path.write_bytes(b"PK\x03\x04 half a zip")
    assert "does save_atomically write over the old checkpoint directly?" in failed_save_slip(path)
    torch.save({"step": 3}, path)
    assert failed_save_slip(path) is None


def test_digest_is_bit_for_bit():
    a = torch.tensor([1.0, 2.0])
    assert digest({"x": a, "n": [1, 2]}) == digest({"n": [1, 2], "x": a.clone()})
    assert digest(a) != digest(torch.tensor([1.0, 2.0 + 2**-20]))
    assert digest(a) != digest(a.double())


def test_fingerprints_logged_and_read(tmp_path, monkeypatch):
    monkeypatch.setattr(resume.dist, "get_rank", lambda: 1)
    model = nn.Linear(2, 1)
    # What fingerprint() reads of an optimizer and a scheduler (a real one costs seconds at first use).
    optimizer = SimpleNamespace(
        state_dict=lambda: {"state": {0: {"exp_avg": torch.ones(2)}}}, param_groups=[{"lr": 0.01}]
    )
    scheduler = SimpleNamespace(state_dict=lambda: {"last_epoch": 4})
    resume.log_fingerprint(tmp_path, "saved", 4, model, optimizer, scheduler, 0)
    resume.log_fingerprint(tmp_path, "restored", 4, model, optimizer, scheduler, 1)
    records = read_fingerprints(tmp_path)
    assert [(r["rank"], r["attempt"], r["event"], r["step"]) for r in records] == [
        (1, 0, "saved", 4),
        (1, 1, "restored", 4),
    ]
    assert records[0]["lr"] == [0.01] and records[0]["cuda_rng"] is None
    assert restart_slip(records) is None


def record(rank, attempt, event, step, **parts):
    base = {"weights": "w", "optimizer": "o", "schedule": "s", "lr": [0.01], "rng": f"rng{rank}", "cuda_rng": None}
    return {"rank": rank, "attempt": attempt, "event": event, "step": step, **base, **parts}


SAVED = [record(r, 0, "saved", s) for r in (0, 1) for s in (4, 8)]


def test_a_restart_that_brings_everything_back():
    assert restart_slip([*SAVED, record(0, 1, "restored", 8), record(1, 1, "restored", 8)]) is None
    assert restart_slip([]) is None


def test_what_else_a_restart_can_lose():
    records = [
        *SAVED,
        record(0, 1, "restored", 8, rng="fresh", optimizer="empty"),
        record(1, 1, "restored", 8, weights="other", schedule="start"),
    ]
    slip = restart_slip(records)
    assert "rank 0's optimizer state (Adam's moments) is not the one it had after step 8" in slip
    assert "rank 0's RNG state is not the one it had after step 8: is it saved and set back?" in slip
    assert "rank 1's weights after the restart are not those it had after step 8" in slip
    assert "rank 1's learning-rate schedule is not where it was after step 8" in slip


def test_the_gpus_generator():
    saved = [record(r, 0, "saved", 8, cuda_rng=f"g{r}") for r in (0, 1)]
    restored = [record(0, 1, "restored", 8, cuda_rng="g0"), record(1, 1, "restored", 8, cuda_rng="g0")]
    assert restart_slip(saved + restored).startswith("rank 1 resumed with rank 0's GPU's generator state")


def test_no_restore_or_a_step_never_saved():
    assert restart_slip(SAVED).startswith("no restarted attempt resumed from a checkpoint")
    slip = restart_slip([*SAVED, record(0, 1, "restored", 9), record(1, 1, "restored", 9)])
    assert slip.startswith("rank 0 resumed after step 9, but no checkpoint was saved after step 9")
