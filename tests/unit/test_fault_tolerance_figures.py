"""parallel_course.fault_tolerance_figures: what chapter 09's figures put where."""

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parallel_course.fault_tolerance_figures import (
    FAILED_COLOUR,
    TimelineRow,
    attempts_from_run,
    describe_roles,
    describe_timeline,
    draw_timeline,
    rank_ends,
    rank_ends_figure,
    rank_errors,
    timeline_figure,
)
from parallel_course.launch import failed_ranks

# What train_ddp.py printed under torchrun --max-restarts=1, rank 1 failing in step 14 (8 steps an epoch).
STDOUT = """backend=gloo device=cpu world_size=2 global batch 64, per rank 32
epoch 1/3: loss 2.0988
backend=gloo device=cpu world_size=2 global batch 64, per rank 32
attempt 1: resumed from work/c09_ckpt/last.pt at step 12 (epoch 2, 4 of 8 steps done)
epoch 2/3: loss 1.1959
epoch 3/3: loss 0.5405
rank 0 wrote work/c09_resumed/final.pt and metrics.json; 2 of 2 ranks reloaded it: equal to their replica
"""
ERRORS = """[rank1]: Traceback (most recent call last):
[rank1]: RuntimeError: injected failure: rank 1 in step 14
[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:24200. This is typically ...
"""
METRICS = {"steps": 24, "epochs": 3, "restarts": 1}


def test_attempts_come_from_the_printed_lines_the_failure_and_the_metrics():
    first, second = attempts_from_run(STDOUT, ERRORS, METRICS, checkpoint_every=4)
    assert (first.first, first.last, first.failed_in, first.checkpoints) == (1, 13, 14, [4, 8, 12])
    assert (second.first, second.last, second.failed_in) == (13, 24, None)
    assert second.checkpoints == [16, 20, 24] and second.resumed_from == (0, 12)
    # Step 13 was completed before the crash and again after the restart.
    assert second.repeated == [13]
    # Another failing step moves the attempt's end, its checkpoints and what runs again.
    first, second = attempts_from_run(STDOUT, ERRORS.replace("step 14", "step 15"), METRICS, checkpoint_every=4)
    assert first.last == 14 and second.repeated == [13, 14]


def test_attempts_refuse_output_that_disagrees_with_itself():
    # The restart did not resume from the last checkpoint the attempt before saved.
    with pytest.raises(ValueError, match="resumed from step 8"):
        attempts_from_run(STDOUT.replace("at step 12", "at step 8"), ERRORS, METRICS, checkpoint_every=4)
    # Checkpoints every 5 steps would have left step 10's, not 12's.
    with pytest.raises(ValueError, match="last checkpoint saved was step 10"):
        attempts_from_run(STDOUT, ERRORS, METRICS, checkpoint_every=5)
    with pytest.raises(ValueError, match="2 attempts printed"):
        attempts_from_run(STDOUT, ERRORS, {**METRICS, "restarts": 0}, checkpoint_every=4)
    with pytest.raises(ValueError, match="no failure"):
        attempts_from_run(STDOUT, "", METRICS, checkpoint_every=4)


def test_draw_timeline_draws_a_box_per_step_done_and_the_failed_one_red():
    rows = attempts_from_run(STDOUT, ERRORS, METRICS, checkpoint_every=4)
    ax = Figure().subplots()
    draw_timeline(ax, rows, epoch_ends=[8, 16])
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    # 13 steps, the failed one, then 12 steps.
    assert len(boxes) == 13 + 1 + 12
    failed = [p for p in boxes if tuple(round(c, 3) for c in p.get_facecolor()[:3]) == _rgb(FAILED_COLOUR)]
    assert [p.get_x() + 0.45 for p in failed] == [14]
    assert len([p for p in boxes if p.get_hatch()]) == 1
    diamonds = [line for line in ax.get_lines() if line.get_marker() == "D"]
    assert sorted(float(line.get_xdata()[0]) for line in diamonds) == [4.5, 8.5, 12.5, 16.5, 20.5, 24.5]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["attempt 1", "attempt 0"]
    # The arrow of the restart starts at the checkpoint of step 12.
    (arrow,) = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    assert arrow.xyann[0] == 12.5


def _rgb(hex_colour):
    return tuple(round(int(hex_colour[i : i + 2], 16) / 255, 3) for i in (1, 3, 5))


def test_the_timeline_text_says_what_each_attempt_did():
    rows = attempts_from_run(STDOUT, ERRORS, METRICS, checkpoint_every=4)
    text = describe_timeline(rows)
    assert "attempt 0: steps 1 to 13 completed, checkpoints after steps 4, 8, 12, failed in step 14." in text
    assert (
        "attempt 1: resumed from attempt 0's step-12 checkpoint, steps 13 to 24 completed (step 13 run again)" in text
    )
    fig = timeline_figure(rows, epoch_ends=[8, 16])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "step that failed" in labels and "step run again" in labels and "end of an epoch" in labels


CRASH_REPORT = """Failures:
[1]:
  time      : 2026-11-28_17:29:32
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 24281)  (SIGTERM)
  traceback : Traceback (most recent call last):
  RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:36768.
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_17:29:31
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 24282)
  traceback : Traceback (most recent call last):
  RuntimeError: injected failure: rank 1 in step 14
============================================================
"""
HANG_ERRORS = """[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [unbound_buffer.cc:78] Timed out waiting 4000ms for recv operation to complete
W1128 17:30:28.291000 24664 api.py:1028] Sending process 24782 closing signal SIGTERM
"""


def test_a_crash_names_the_rank_that_raised_and_a_hang_the_silent_one():
    crash = rank_ends({r: lines[-1] for r, lines in failed_ranks(CRASH_REPORT).items()}, 2, 14)
    assert [(e.rank, e.culprit, e.ended) for e in crash] == [
        (0, False, "error: lost its peer"),
        (1, True, "exits with its own error"),
    ]
    hang = rank_ends(rank_errors(HANG_ERRORS), 2, 14)
    assert [(e.rank, e.culprit, e.ended) for e in hang] == [
        (0, False, "error: timed out after 4000 ms"),
        (1, True, "stopped by torchrun (SIGTERM)"),
    ]
    # A victim stopped before it could report: still a victim while another rank raised.
    stopped = rank_ends({1: "RuntimeError: injected failure: rank 1 in step 14"}, 2, 14)
    assert [e.culprit for e in stopped] == [False, True]
    assert stopped[0].ended == "stopped by torchrun (SIGTERM)"
    # The plain text is the same whichever way the crash's victim went.
    assert describe_roles("crash", stopped) == describe_roles("crash", crash)


def test_rank_ends_figure_has_a_lane_per_rank_and_a_panel_per_failure():
    crash = rank_ends({1: "RuntimeError: injected failure: rank 1 in step 14"}, 2, 14)
    hang = rank_ends(rank_errors(HANG_ERRORS), 2, 14)
    fig = rank_ends_figure([("crash", crash), ("hang", hang)])
    assert [ax.get_title() for ax in fig.axes] == ["crash", "hang"]
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert texts.count("culprit") == 1 and texts.count("victim") == 1
    assert "stops answering in step 14" in texts and "error: timed out after 4000 ms" in texts


def test_a_row_with_a_seed_checkpoint_widens_the_axis_to_step_zero():
    ax = Figure().subplots()
    draw_timeline(ax, [TimelineRow("seed", 1, 0, checkpoints=[0]), TimelineRow("run", 1, 4)])
    assert ax.get_xlim()[0] < 0.5
