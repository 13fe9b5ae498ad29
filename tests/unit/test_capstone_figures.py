"""parallel_course.capstone_figures: what chapter 11c's figures put where."""

import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parallel_course.capstone_figures import (
    chain,
    checkpoint_steps,
    describe_micro_batches,
    describe_saved_tensors,
    draw_micro_batches,
    draw_saved_tensors,
    draw_token_weights,
    job_row,
    layout_name,
    micro_batch_view,
    micro_batches_figure,
    saved_tensors,
    saved_tensors_figure,
    seed_row,
)
from parallel_course.fault_tolerance_figures import describe_timeline

I = -100  # noqa: E741 (the ignored target, as the GPT's)
# Two micro-batches of two problems: 3 answer tokens in the first, 1 in the second.
TARGETS = [torch.tensor([[I, 4, 2], [I, I, 7]]), torch.tensor([[I, I, 5], [I, I, I]])]


def test_the_view_counts_each_micro_batchs_answer_tokens_and_weighs_them_by_either_rule():
    view = micro_batch_view(TARGETS, I)
    assert view.counts == [3, 1] and view.total == 4
    assert view.targets[0] == [[None, 4, 2], [None, None, 7]]
    assert view.global_weights == [1 / 4, 1 / 4]
    # The mean of 2 means: a token of the short micro-batch weighs 1/2, one of the long 1/6.
    assert view.mean_of_means_weights == pytest.approx([1 / 6, 1 / 2])
    # Equal counts: both rules agree.
    even = micro_batch_view([torch.tensor([[I, 1]]), torch.tensor([[2, I]])], I)
    assert even.global_weights == pytest.approx(even.mean_of_means_weights)


def test_draw_micro_batches_colours_a_cell_per_answer_token_with_its_digit():
    view = micro_batch_view(TARGETS, I)
    ax = Figure().subplots()
    draw_micro_batches(ax, view)
    cells = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(cells) == 4 * 3
    digits = sorted(t.get_text() for t in ax.texts if t.get_text().isdigit())
    assert digits == ["2", "4", "5", "7"]
    assert {t.get_text() for t in ax.texts} >= {"micro-batch 1:\n3 tokens", "micro-batch 2:\n1 tokens"}


def test_draw_token_weights_draws_both_rules_times_the_global_count():
    view = micro_batch_view(TARGETS, I)
    ax = Figure().subplots()
    draw_token_weights(ax, view)
    heights = [p.get_height() for p in ax.patches]
    # Global count: 1 for every micro-batch; mean of means: N / (K n_i) = 4/6 and 4/2.
    assert heights == pytest.approx([1, 1, 4 / 6, 2])
    assert "1/(K n_i): 0.67/4, 2.00/4" in describe_micro_batches(view)
    assert len(micro_batches_figure(view).axes) == 2


SINGLE = {"world_size": 1, "parallel": "single", "start_step": 0, "steps": 8, "checkpoints": [{"step": 4}, {"step": 8}]}
TP = {"world_size": 2, "parallel": "tp", "start_step": 4, "steps": 8, "checkpoints": []}


def test_jobs_come_from_their_metrics_and_each_continuation_from_a_checkpoint_saved():
    rows = chain([job_row(SINGLE), job_row(TP)], {1: 0})
    assert [layout_name(SINGLE), layout_name(TP)] == ["one process", "tp on 2"]
    assert (rows[0].steps, rows[0].checkpoints) == (list(range(1, 9)), [4, 8])
    assert rows[1].steps == [5, 6, 7, 8] and rows[1].resumed_from == (0, 4)
    assert "tp on 2: resumed from one process's step-4 checkpoint, steps 5 to 8 completed." in describe_timeline(rows)
    # A continuation from a step its source never saved.
    with pytest.raises(ValueError, match="starts after step 5"):
        chain([job_row(SINGLE), job_row({**TP, "start_step": 5})], {1: 0})


def test_a_seed_row_lists_only_complete_checkpoints(tmp_path):
    (tmp_path / "step-000000").mkdir()
    (tmp_path / "step-000000" / ".metadata").write_bytes(b"")
    # Cut short: no .metadata.
    (tmp_path / "step-000003").mkdir()
    assert checkpoint_steps(tmp_path) == [0]
    row = seed_row("seed", tmp_path)
    assert row.steps == [] and row.checkpoints == [0]


def _metadata(pieces):
    """DCP's metadata of one checkpoint: {name: (size, [(offsets, sizes, writer)])}."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    state, storage = {}, {}
    for name, (size, chunks) in pieces.items():
        state[name] = TensorStorageMetadata(
            TensorProperties(dtype=torch.float32),
            torch.Size(size),
            [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s, _ in chunks],
        )
        for o, _, writer in chunks:
            storage[MetadataIndex(name, torch.Size(o))] = _StorageInfo(f"__{writer}_0.distcp", 0, 1)
    return Metadata(state, storage_data=storage)


def test_saved_tensors_say_which_rank_s_file_holds_which_rows_and_columns():
    metadata = _metadata(
        {
            "model.w": ((8, 4), [((4, 0), (4, 4), 1), ((0, 0), (4, 4), 0)]),
            "model.b": ((8,), [((0,), (8,), 1)]),
            "model.p": ((4, 8), [((0, 0), (4, 4), 0), ((0, 4), (4, 4), 1)]),
        }
    )
    w, b, p = saved_tensors(metadata, ["model.w", "model.b", "model.p"])
    assert w.pieces == [((0, 4), (0, 4), 0), ((4, 8), (0, 4), 1)] and w.shape == (8, 4)
    assert b.pieces == [((0, 8), (0, 1), 1)]
    assert p.pieces == [((0, 4), (0, 4), 0), ((0, 4), (4, 8), 1)]
    ax = Figure().subplots()
    draw_saved_tensors(ax, "saved", [w, b, p])
    boxes = [(round(r.get_x(), 3), round(r.get_width(), 3), r.get_facecolor()[:3]) for r in ax.patches]
    # w's two halves side by side, b whole, p's column halves one above the other.
    assert [(x, width) for x, width, _ in boxes] == [(0, 0.5), (0.5, 0.5), (0, 1), (0, 1), (0, 1)]
    assert describe_saved_tensors("saved", [w]) == "saved: w [8, 4]: rows 0-3 by rank 0, rows 4-7 by rank 1."
    assert len(saved_tensors_figure([("a", [w]), ("b", [b])]).legends[0].get_texts()) == 2
