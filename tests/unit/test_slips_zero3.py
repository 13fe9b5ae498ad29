"""Lab 11's slip recognition (parallel_course.slips.zero3): the patterns no injected slip makes
named, nothing named where there is no pattern. The slips the checks name for the solution with each
slip injected: tests/course/test_slips_lab11_shard_of.py (shard_of's pieces cut too short, not
padded, strided, the same on every rank, a view) and tests/launches/test_slips_lab11.py (2 ranks)."""

import pytest
import torch

from parallel_course.checks import CheckFailed
from parallel_course.slips.zero3 import check_pieces, collective_slip, gradient_scale_slip, kept_whole_slip, shard_slip

FLAT = torch.arange(1.0, 11.0)
RIGHT = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 0.0, 0.0]]


def pieces(*values):
    return [torch.tensor(v) for v in values]


def test_right_pieces_name_nothing_and_pass(capsys):
    right = pieces(*RIGHT)
    assert shard_slip(right, FLAT, 3) is None
    check_pieces("shard_of", right, FLAT, RIGHT)
    assert capsys.readouterr().out.startswith("PASS shard_of: ")


def test_wrong_values_without_a_pattern_keep_the_plain_fail_line():
    wrong = pieces([4.0, 3, 2, 1], [8.0, 7, 6, 5], [0.0, 0, 10, 9])
    assert shard_slip(wrong, FLAT, 3) is None
    with pytest.raises(CheckFailed) as failed:
        check_pieces("shard_of", wrong, FLAT, RIGHT)
    assert str(failed.value) == f"FAIL shard_of: expected {RIGHT}, got {[p.tolist() for p in wrong]}"


GRADS = [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([[0.25, 3.0]])]


def test_the_sum_over_3_ranks_is_3_times_the_average():
    # The lab checks at 2 ranks (the injected slip) and at 3.
    assert gradient_scale_slip([3 * g for g in GRADS], GRADS, 3) == (
        "every gradient is 3.00x the reference's: does backward return the sum instead of the average?"
    )


def test_divided_twice_and_another_constant():
    assert gradient_scale_slip([g / 2 for g in GRADS], GRADS, 2).endswith("divided by the number of ranks once more?")
    assert gradient_scale_slip([-g for g in GRADS], GRADS, 2) == "every gradient is -1.00x the reference's"


def test_no_constant_factor_names_nothing():
    assert gradient_scale_slip(GRADS, GRADS, 2) is None
    assert gradient_scale_slip([GRADS[0] * 2, GRADS[1]], GRADS, 2) is None
    assert gradient_scale_slip([GRADS[0]], GRADS, 2) is None
    assert gradient_scale_slip([torch.ones(3), torch.ones(1, 2)], [torch.zeros(3), torch.zeros(1, 2)], 2) is None


def test_collective_counts():
    assert collective_slip(20, 20, 20, 0, 20) is None
    # (no all-gather in backward, all-reduces for reduce-scatters: the injected slips)
    assert collective_slip(20, 20, 0, 0, 20).startswith("no reduce-scatter in backward")
    assert collective_slip(0, 0, 20, 0, 20).startswith("no all-gather at all")
    assert collective_slip(40, 20, 20, 0, 20) is None


def test_no_parameter_kept_whole_names_nothing():
    # (kept after forward, or after backward without finally: the injected slips)
    assert kept_whole_slip([]) is None
