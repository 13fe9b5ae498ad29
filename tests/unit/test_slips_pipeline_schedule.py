"""Lab 07a's slips: valid orders that wait for nothing, each recognised; the package's own schedules
and exact counts, orders far over the budget, malformed orders and a formula that gives no number
raise none. The orders that hold too much and the formulas that miss, as the checks name them for
the solution with each slip injected: tests/course/test_slips_lab07.py."""

from parallel_course.model_parallel import makespan, stage_orders, timeline
from parallel_course.slips.pipeline_schedule import budget_slip, formula_slip, slow_slip

F, B = "F", "B"


def gpipe(n_stages, n_microbatches):
    return stage_orders("gpipe", n_stages, n_microbatches)


def test_holding_no_more_than_allowed_or_far_more():
    # 1F1B holds p - s: within any budget of p or more
    assert budget_slip(stage_orders("1f1b", 3, 5), 3, 5) is None
    # (the cap p - s left out, one more than allowed: the injected slips)
    # far over the budget: no slip named
    assert budget_slip(gpipe(2, 4), 2, 1) is None
    assert budget_slip("not orders", 2, 1) is None


def test_1f1b_waits_for_nothing():
    # (a fixed alternation of forwards and backwards waiting while a backward is ready: the injected slip)
    assert slow_slip(stage_orders("1f1b", 4, 8), 4, 4) is None


def test_running_a_forward_while_a_backward_is_ready():
    # one stage: F0 then F1 though B0 could run at once
    assert slow_slip([[(F, 0), (F, 1), (B, 0), (B, 1)]], 1, 2).startswith("at slot 1 stage 0 runs F1 while B0 is ready")


def test_waiting_while_a_forward_fits():
    # a budget of 2, but stage 0 takes one micro-batch down and back up before the next
    orders = [[(F, 0), (B, 0), (F, 1), (B, 1)], [(F, 0), (B, 0), (F, 1), (B, 1)]]
    assert slow_slip(orders, 2, 2).startswith("at slot 1 stage 0 waits while F1 is ready and it holds 1 of 2")
    assert slow_slip("not orders", 2, 2) is None


def fits(formula, cases):
    return {case: (formula(*case), int(makespan(timeline(stage_orders("1f1b", case[0], case[1]))))) for case in cases}


def test_a_right_formula_or_no_number_names_nothing():
    # budgets of p or more, where 1F1B's 2(m + p - 1) is the right count
    cases = [(p, m, k) for p in range(1, 5) for m in range(1, 7) for k in range(p, p + 3)]
    assert formula_slip(fits(lambda p, m, k: 2 * (m + p - 1), cases)) is None
    # (off by a constant, not whole, wrong above p, 1F1B's count, the left-over group: the injected slips)
    assert formula_slip(fits(lambda p, m, k: None, cases)) is None
