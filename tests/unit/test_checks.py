"""The verdicts of lab check cells: a FAIL says what came back and, when recognised, the slip."""

import pytest
import torch

from parallel_course.checks import CheckFailed, check_close, check_equal, matching_slip, scale_of


def test_a_fail_names_the_slip_after_the_numbers(capsys):
    with pytest.raises(CheckFailed, match=r"^FAIL sum: expected 3, got 4: added one too many\?$"):
        check_equal("sum", 4, 3, slip="added one too many?")
    with pytest.raises(CheckFailed, match=r"^FAIL sum: expected 3, got 4$"):
        check_equal("sum", 4, 3)
    with pytest.raises(CheckFailed, match=r"max \|difference\| = 1, tolerance 0.1: twice\?$"):
        check_close("x", torch.tensor([2.0]), torch.tensor([1.0]), atol=0.1, slip="twice?")
    with pytest.raises(CheckFailed, match=r"expected a tensor, got None: never written$"):
        check_close("x", None, torch.tensor([1.0]), atol=0.1, slip="never written")
    # a PASS never mentions a slip
    check_close("x", torch.tensor([1.0]), torch.tensor([1.0]), atol=0.1, slip="twice?")
    check_equal("sum", 3, 3, slip="added one too many?")
    assert "twice" not in capsys.readouterr().out


def test_scale_of_finds_one_factor_or_none():
    expected = [torch.tensor([1.0, -2.0]), torch.tensor([[3.0]])]
    assert scale_of([2 * t for t in expected], expected) == pytest.approx(2.0)
    assert scale_of(torch.tensor([0.5, -1.0, 1.5]), torch.tensor([1.0, -2.0, 3.0])) == pytest.approx(0.5)
    assert scale_of([2.0, 4.0], [1.0, 2.0]) == pytest.approx(2.0)
    # two factors, a shape that differs, nothing to scale, no tensor at all
    assert scale_of(torch.tensor([2.0, 3.0]), torch.tensor([1.0, 1.0])) is None
    assert scale_of(torch.tensor([2.0]), torch.tensor([1.0, 1.0])) is None
    assert scale_of(torch.tensor([1.0]), torch.tensor([0.0])) is None
    assert scale_of(None, torch.tensor([1.0])) is None
    assert scale_of(torch.tensor([float("nan")]), torch.tensor([1.0])) is None


def test_matching_slip_is_the_first_result_equal_within_the_tolerance():
    slips = {"summed": torch.tensor([2.0, 4.0]), "averaged": torch.tensor([1.0, 2.0])}
    assert matching_slip(torch.tensor([1.0, 2.0 + 1e-7]), slips, atol=1e-6) == "averaged"
    assert matching_slip(torch.tensor([2.0, 4.0]), slips, atol=1e-6) == "summed"
    assert matching_slip(torch.tensor([3.0, 4.0]), slips, atol=1e-6) is None
    assert matching_slip(torch.tensor([1.0]), slips, atol=1e-6) is None
    assert matching_slip(None, slips, atol=1e-6) is None
