"""Lab 07b's slip recognition (parallel_course.slips.tensor_parallel): each pattern named from
every rank's results, nothing named where there is no pattern."""

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
    [
        ("column", {"weight": (16, 16), "bias": (16,)}, None),
        ("row", {"weight": (32, 8), "bias": (32,)}, None),
        ("column", {"weight": (32, 8), "bias": (16,)}, "W is split along its input features (dim 1)"),
        ("row", {"weight": (16, 16), "bias": (32,)}, "W is split along its output features (dim 0)"),
        ("row", {"weight": (32, 16), "bias": (32,)}, "the whole W on every rank"),
        ("column", {"weight": (16, 16), "bias": (32,)}, "the whole bias: in a column-parallel layer"),
        ("row", {"weight": (32, 8), "bias": (16,)}, "a slice of the bias: a row-parallel layer"),
        ("row", {"weight": (32, 8), "bias": None}, "self.bias is not a tensor"),
        ("column", {"weight": (4, 4), "bias": (4,)}, None),
    ],
)
def test_parameter_shapes(kind, got, words):
    slip = parameter_slip(kind, got, (32, 16), N)
    assert slip == words if words is None else words in slip


def test_right_outputs_name_nothing():
    assert output_slip([EXPECTED] * N, EXPECTED, B, 0) is None


def test_only_this_ranks_slice_of_the_output():
    slices = list(EXPECTED.chunk(N, dim=-1))
    assert output_slip(slices, EXPECTED, B, 1).startswith("only this rank's slice of the output features")


def test_the_bias_added_on_every_rank():
    outputs = [sum(PARTIALS) + N * B] * N
    assert output_slip(outputs, EXPECTED, B, 0).startswith("the bias is added on every rank")


@pytest.mark.parametrize("with_bias", [True, False])
def test_partial_results_not_summed(with_bias):
    outputs = [p + B if with_bias else p for p in PARTIALS]
    assert "the partial results are not summed over the ranks" in output_slip(outputs, EXPECTED, B, 0)


def test_output_features_in_another_order():
    order = [i for r in range(N) for i in range(r, 32, N)]
    slip = output_slip([EXPECTED[:, order]] * N, EXPECTED, B, 0)
    assert slip.startswith("the right output features in another order") and "expected feature 2" in slip


def test_wrong_outputs_without_a_pattern():
    assert output_slip([EXPECTED + 1] * N, EXPECTED, B, 0) is None
    assert output_slip([torch.zeros(4, 5)] * N, EXPECTED, B, 0) is None
    assert output_slip([None] * N, EXPECTED, B, 0) is None


def test_input_gradient_only_this_ranks_slice():
    grads = [
        torch.cat([g if i == r else torch.zeros_like(g) for i, g in enumerate(X.chunk(N, dim=1))], 1) for r in range(N)
    ]
    assert gradient_slip(grads, X, 0).startswith("the input gradient holds only this rank's slice of the features")


def test_input_gradient_only_this_ranks_contribution():
    parts = [X * 0.25, X * 0.75]
    assert gradient_slip(parts, X, 1).startswith("each rank's input gradient is only its own contribution")


def test_gradients_scaled_or_right():
    assert gradient_slip([X, X], X, 0) is None
    assert gradient_slip([2 * X, 2 * X], X, 0) == "every element is 2.00x the expected one"
    assert scale_slip(0.5 * W, W) == "every element is 0.50x the expected one"
    assert scale_slip(W + 1, W) is None
    assert scale_slip(W, torch.zeros_like(W)) is None
    assert scale_slip(None, W) is None
