"""parallel_course.runs: what the notebooks read back from a training run's --out folder."""

import json
import re

import pytest
import torch

from parallel_course.runs import final_weights, metrics


def test_final_weights_is_the_state_dict_flattened_in_order(tmp_path):
    torch.save({"linear.weight": torch.tensor([[1.0, 2.0]]), "linear.bias": torch.tensor([3.0])}, tmp_path / "final.pt")
    assert torch.equal(final_weights(tmp_path), torch.tensor([1.0, 2.0, 3.0]))


def test_final_weights_refuses_pickled_code(tmp_path):
    torch.save({"w": torch.ones(1), "extra": print}, tmp_path / "final.pt")
    with pytest.raises(Exception, match="weights_only"):
        final_weights(tmp_path)


def test_metrics_reads_metrics_json(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"loss": [1.0, 0.5], "world_size": 2}))
    assert metrics(tmp_path) == {"loss": [1.0, 0.5], "world_size": 2}


def test_plot_memory_by_layout_draws_one_bar_per_part_and_layout():
    from matplotlib.figure import Figure

    from parallel_course.runs import MEMORY_PARTS, plot_memory_by_layout

    memory = [{part: 1000.0 * (i + 1) for i, part in enumerate(MEMORY_PARTS)}]
    runs = {"single": {"world_size": 1, "memory": memory}, "fsdp": {"world_size": 2, "memory": memory}}
    ax = Figure().subplots()
    plot_memory_by_layout(ax, runs)
    assert len(ax.patches) == len(MEMORY_PARTS) * len(runs)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["single (1)", "fsdp (2)"]
    assert sorted(p.get_height() for p in ax.patches)[-1] == 4.0  # kB


def test_plot_learning_draws_the_loss_of_every_step_and_the_share_solved_in_percent():
    from matplotlib.figure import Figure

    from parallel_course.runs import plot_learning

    axes = Figure().subplots(1, 2)
    plot_learning(axes, [2.5, 1.0, 0.1], {25: 0.1, 50: 0.95})
    (loss,), (solved,) = axes[0].get_lines(), axes[1].get_lines()
    assert list(loss.get_xdata()) == [1, 2, 3] and list(loss.get_ydata()) == [2.5, 1.0, 0.1]
    assert axes[0].get_yscale() == "log"
    assert list(solved.get_xdata()) == [25, 50] and list(solved.get_ydata()) == [10.0, 95.0]


def test_trained_alike_compares_losses_and_gradient_norms(capsys):
    from parallel_course.checks import CheckFailed
    from parallel_course.runs import check_trained_alike, relative_gaps

    reference = {"losses": [2.0, 1.0], "gradient_norms": [4.0, 2.0]}
    assert relative_gaps({"losses": [1.0, 0.5]}, reference, "losses").tolist() == [-0.5, -0.5]
    # A resumed run: the reference's later steps.
    assert relative_gaps({"losses": [1.1]}, reference, "losses", slice(1, None)).tolist() == pytest.approx([0.1])
    check_trained_alike("same", {"losses": [2.0, 1.0], "gradient_norms": [4.0, 2.00001]}, reference, 1e-4)
    assert capsys.readouterr().out.count("PASS") == 2
    # Equal losses, the norms doubled: the norms fail.
    with pytest.raises(CheckFailed, match=re.escape("gradient_norms, relative: max |difference| = 1")):
        check_trained_alike("doubled", {"losses": [2.0, 1.0], "gradient_norms": [8.0, 4.0]}, reference, 1e-4)


def test_a_negative_control_must_pass_on_losses_and_fail_on_norms(capsys):
    from parallel_course.checks import CheckFailed
    from parallel_course.runs import check_negative_control

    reference = {"losses": [2.0, 1.0], "gradient_norms": [4.0, 2.0]}
    check_negative_control("half", {"losses": [2.0, 1.0], "gradient_norms": [2.0, 1.0]}, reference, 1e-4)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PASS half: losses")
    assert out[1].startswith("negative control: FAIL half: gradient_norms") and out[1].endswith(
        "0.5 times the reference's"
    )
    # Norms that do not share one factor: no factor named.
    check_negative_control("off", {"losses": [2.0, 1.0], "gradient_norms": [4.0, 3.0]}, reference, 1e-4)
    assert capsys.readouterr().out.splitlines()[1].endswith("tolerance 0.0001")
    # A control the norm check cannot see is an error; one whose losses differ fails at the losses.
    with pytest.raises(AssertionError, match="cannot see the mistake"):
        check_negative_control("same", reference, reference, 1e-4)
    with pytest.raises(CheckFailed, match="losses"):
        check_negative_control("other", {"losses": [3.0, 1.0], "gradient_norms": [2.0, 1.0]}, reference, 1e-4)


def test_describe_memory_by_layout_gives_each_part_of_each_layout_in_kb():
    from parallel_course.runs import MEMORY_PARTS, describe_memory_by_layout

    memory = [{part: 1000.0 * (i + 1) for i, part in enumerate(MEMORY_PARTS)}]
    runs = {"single": {"world_size": 1, "memory": memory}, "fsdp": {"world_size": 2, "memory": memory}}
    text = describe_memory_by_layout(runs)
    assert "kB held on rank 0 by layout: single (1 process): parameter 1.0" in text
    assert "fsdp (2 processes): parameter 1.0, gradient 2.0" in text
    assert "optimizer state 3.0, activation 4.0." in text


def test_describe_learning_gives_the_numbers_in_alt_and_not_in_plain():
    from parallel_course.runs import describe_learning

    alt, plain = describe_learning([2.5, 1.0, 0.2, 0.1], {2: 0.1, 4: 0.95})
    assert "loss 2.500 at step 1, 1.000 at step 2, 0.100 at step 4, lowest 0.100" in alt
    assert "solved 10% at step 2, 95% at step 4" in alt
    assert "every 2 steps" in plain and "95%" not in plain and "2.500" not in plain
