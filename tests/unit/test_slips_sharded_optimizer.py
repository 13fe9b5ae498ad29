"""Lab 08's slip recognition (parallel_course.slips.sharded_optimizer): the patterns no injected slip
makes named from every rank's results, nothing named where there is no pattern. The slips the
checker names for the solution with each slip injected: tests/launches/test_slips_lab08.py."""

import torch

from parallel_course.slips.sharded_optimizer import (
    INITIAL,
    LR_UNCHANGED,
    OTHER,
    REFERENCE,
    balance_slip,
    state_slip,
    weight_status,
    weights_slip,
)

# lab 08's model: 4 weight matrices and their biases, in the model's order.
NUMELS = [4096, 128, 16384, 128, 16384, 128, 4096, 32]
BALANCED = [0, 1, 1, 0, 0, 1, 1, 0]


def test_weight_status():
    ref, init, unchanged = [torch.ones(2)] * 4, [torch.zeros(2)] * 4, [torch.full((2,), 3.0)] * 4
    final = [torch.ones(2) + 1e-9, torch.zeros(2), torch.full((2,), 3.0), torch.full((2,), 5.0)]
    assert weight_status(final, ref, init, unchanged, 1e-6) == [REFERENCE, INITIAL, LR_UNCHANGED, OTHER]


def test_balance():
    assert balance_slip(BALANCED, NUMELS, 2) is None
    # (round-robin by position: the injected slip)
    assert balance_slip([0] * 8, NUMELS, 2) == "every parameter is owned by rank 0"
    # Round-robin over parameters of equal size is a balance by size too.
    assert balance_slip([0, 1, 0, 1], [10] * 4, 2) is None


def test_state():
    assert state_slip([[0, 3, 4, 7], [1, 2, 5, 6]], BALANCED, 8) is None
    # (every rank's state for every parameter: the injected slip; state for the parameters a rank does not
    # own leaves every parameter with state on one rank, so the checker's FAIL never shows this one)
    assert state_slip([[1, 2, 5, 6], [0, 3, 4, 7]], BALANCED, 8).startswith(
        "each rank holds state for the parameters it does not own"
    )
    assert state_slip([[1, 2, 5, 6], [0, 3, 4, 7]], None, 8) is None


def test_weights_right_or_without_a_pattern():
    # (none moved, the learning rate lost, only each rank's own moved, one rank's never moved: the injected
    # slips)
    assert weights_slip([[REFERENCE] * 8] * 2, BALANCED) is None
    assert weights_slip([[OTHER] * 8] * 2, BALANCED) is None
    assert weights_slip([[OTHER if owner == 0 else INITIAL for owner in BALANCED]] * 2, None) is None
    assert weights_slip([[INITIAL] * 7 + [OTHER]] * 2, BALANCED) is None
