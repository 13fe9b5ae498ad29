"""Lab 07b's slip recognition (parallel_course.slips.tensor_parallel): the patterns no injected slip
makes named from every rank's results, nothing named where there is no pattern. The slips the
checker names for the solution with each slip injected: tests/launches/test_slips_lab07b.py."""

import pytest
import torch

from parallel_course.slips.tensor_parallel import (
    expected_shapes,
    gradient_slip,
    output_slip,
    parameter_slip,
    scale_slip,
)

N = 2
torch.manual_seed(0)
X, W, B = torch.randn(4, 16), torch.randn(32, 16), torch.randn(32)
EXPECTED = X @ W.T + B
# Rank r's partial result of a row-parallel layer: its slice of the input features.
PARTIALS = [x @ w.T for x, w in zip(X.chunk(N, dim=1), W.chunk(N, dim=1))]


def test_expected_shapes():
    assert expected_shapes("column", (32, 16), 2) == {"weight": (16, 16), "bias": (16,)}
    assert expected_shapes("row", (32, 16), 2) == {"weight": (32, 8), "bias": (32,)}


@pytest.mark.parametrize(
    "kind, got, words",
    # (W split along the wrong dimension, the bias whole or split where it should not be: the injected slips)
    [
        ("column", {"weight": (16, 16), "bias": (16,)}, None),
        ("row", {"weight": (32, 8), "bias": (32,)}, None),
        ("row", {"weight": (32, 16), "bias": (32,)}, "the whole W on every rank"),
        ("row", {"weight": (32, 8), "bias": None}, "self.bias is not a tensor"),
        ("column", {"weight": (4, 4), "bias": (4,)}, None),
    ],
)
def test_parameter_shapes(kind, got, words):
    slip = parameter_slip(kind, got, (32, 16), N)
    assert slip == words if words is None else words in slip


def test_right_outputs_name_nothing():
    assert output_slip([EXPECTED] * N, EXPECTED, B, 0) is None


def test_partial_results_not_summed_and_no_bias_added():
    # (not summed, each with the bias: the injected slip; so are the bias added on every rank and the
    # features in another order)
    assert "the partial results are not summed over the ranks" in output_slip(PARTIALS, EXPECTED, B, 0)


def test_wrong_outputs_without_a_pattern():
    assert output_slip([EXPECTED + 1] * N, EXPECTED, B, 0) is None
    assert output_slip([torch.zeros(4, 5)] * N, EXPECTED, B, 0) is None
    assert output_slip([None] * N, EXPECTED, B, 0) is None


def test_gradients_scaled_or_right():
    # (only this rank's slice, or only its own contribution: the injected slips)
    assert gradient_slip([X, X], X, 0) is None
    assert gradient_slip([2 * X, 2 * X], X, 0) == "every element is 2.00x the expected one"
    assert scale_slip(0.5 * W, W) == "every element is 0.50x the expected one"
    assert scale_slip(W + 1, W) is None
    assert scale_slip(W, torch.zeros_like(W)) is None
    assert scale_slip(None, W) is None
