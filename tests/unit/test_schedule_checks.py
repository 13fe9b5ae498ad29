"""Lab 07a's schedule checks: each one flags its own slip, naming the stage and the operation, and
passes a valid schedule."""

import pytest

from parallel_course.checks import CheckFailed
from parallel_course.model_parallel import makespan, stage_orders, timeline
from parallel_course.schedule_checks import (
    check_schedule,
    check_slots,
    deadlock_problem,
    held_per_stage,
    schedule_problem,
    slots_problem,
)

F, B = "F", "B"


def one_at_a_time(n_stages, n_microbatches):
    """A valid schedule that holds one micro-batch per stage: each micro-batch down and back up."""
    return [[op for i in range(n_microbatches) for op in ((F, i), (B, i))] for _ in range(n_stages)]


def test_a_valid_schedule_passes(capsys):
    orders = one_at_a_time(2, 3)
    ops = check_schedule("one at a time", orders, 2, 3, 1)
    assert "PASS one at a time" in capsys.readouterr().out
    assert schedule_problem(orders, 2, 3, [1, 1]) is None
    assert held_per_stage(orders) == [1, 1]
    # each micro-batch goes down two stages and back: 4 slots, one after the other
    check_slots("one at a time", ops, 3, 12)
    assert "PASS one at a time: 12 slots" in capsys.readouterr().out


def test_1f1b_passes_within_what_it_holds():
    orders = stage_orders("1f1b", 4, 8)
    assert schedule_problem(orders, 4, 8, [4, 3, 2, 1]) is None
    assert slots_problem(timeline(orders), 8, int(makespan(timeline(orders)))) is None


def test_a_missing_operation_is_named():
    orders = one_at_a_time(2, 3)
    orders[1].remove((B, 2))
    assert schedule_problem(orders, 2, 3, 1) == "stage 1 never runs B2"
    with pytest.raises(CheckFailed, match="FAIL missing: stage 1 never runs B2"):
        check_schedule("missing", orders, 2, 3, 1)


def test_an_operation_run_twice_or_unknown_is_named():
    orders = one_at_a_time(2, 2)
    orders[0].append((F, 1))
    assert schedule_problem(orders, 2, 2, 2) == "stage 0 runs F1 twice"
    assert "micro-batches are 0..1" in schedule_problem([[(F, 0), (B, 0), (F, 2)], [(F, 0), (B, 0)]], 2, 2, 2)
    assert "an operation is" in schedule_problem([[("X", 0)], []], 2, 1, 1)


def test_a_backward_before_its_forward_is_named():
    orders = one_at_a_time(2, 2)
    orders[0] = [(B, 0), (F, 0), (F, 1), (B, 1)]
    assert schedule_problem(orders, 2, 2, 2).startswith("stage 0 runs B0 before its own F0")


def test_over_budget_is_named():
    # GPipe holds every micro-batch on every stage
    orders = stage_orders("gpipe", 2, 3)
    problem = schedule_problem(orders, 2, 3, 2)
    assert problem == "stage 0 holds 3 micro-batches at F2 (F0 F1 F2, none of them backward yet): its budget is 2"
    with pytest.raises(CheckFailed, match="its budget is 2"):
        check_schedule("gpipe", orders, 2, 3, 2)
    # one budget per stage: only the stage over its own budget is named
    assert schedule_problem(orders, 2, 3, [3, 2]).startswith("stage 1 holds 3")


def test_a_broken_dependency_deadlocks_and_is_named():
    # stage 0 waits for B0 from stage 1 before it sends F1, stage 1 runs F1 before B0: both wait
    orders = [[(F, 0), (B, 0), (F, 1), (B, 1)], [(F, 0), (F, 1), (B, 0), (B, 1)]]
    problem = deadlock_problem(orders)
    assert problem == (
        "the orders deadlock: stage 0 waits at B0 for stage 1's B0; stage 1 waits at F1 for stage 0's F1"
    )
    assert schedule_problem(orders, 2, 2, 2) == problem
    with pytest.raises(CheckFailed, match="deadlock"):
        check_schedule("crossed", orders, 2, 2, 2)


def test_a_wrong_slot_count_is_named():
    ops = timeline(one_at_a_time(2, 3))
    assert slots_problem(ops, 3, 12) is None
    assert slots_problem(ops, 3, 11) == (
        "the formula predicts 11 slots, the timeline takes 12 (idle per stage: [6, 6])"
    )
    with pytest.raises(CheckFailed, match="FAIL slots: the formula predicts 13 slots"):
        check_slots("slots", ops, 3, 13)


def test_orders_of_the_wrong_shape_are_named():
    assert schedule_problem("F0 B0", 1, 1, 1).startswith("expected a list of 1 orders")
    assert schedule_problem([[(F, 0), (B, 0)]], 2, 1, 1) == "expected 2 orders (one per stage), got 1"
