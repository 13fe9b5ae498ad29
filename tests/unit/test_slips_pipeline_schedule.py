"""Lab 07a's slips: orders that hold too much, valid orders that wait for nothing, formulas that
miss, each recognised; the package's own schedules and exact counts raise none."""

from parallel_course.model_parallel import makespan, stage_orders, timeline
from parallel_course.slips.pipeline_schedule import budget_slip, formula_slip, slow_slip

F, B = "F", "B"


def gpipe(n_stages, n_microbatches):
    return stage_orders("gpipe", n_stages, n_microbatches)


def test_holding_more_than_allowed():
    # 1F1B holds p - s: within any budget of p or more
    assert budget_slip(stage_orders("1f1b", 3, 5), 3, 5) is None
    # GPipe on 3 stages, 2 micro-batches: 2 held everywhere; the budget allows 2, stage 2 only 1
    assert "within the budget of 2, but more than p - s = 1, what 1F1B holds on stage 2" in budget_slip(
        gpipe(3, 2), 3, 2
    )
    # 2 held where the budget is 1: one too many
    assert "one more than stage 0 may hold: is a comparison off by one" in budget_slip(gpipe(2, 2), 2, 1)
    # far over the budget: no slip named
    assert budget_slip(gpipe(2, 4), 2, 1) is None
    assert budget_slip("not orders", 2, 1) is None


def test_waiting_while_a_backward_is_ready():
    # 1F1B's fixed alternation, its fill capped at 2 on 4 stages: at slot 7 stage 2 waits for F2
    orders = []
    for s in range(4):
        fill = min(2, 4 - s)
        order = [(F, i) for i in range(fill)]
        for i in range(8 - fill):
            order += [(B, i), (F, fill + i)]
        orders.append(order + [(B, i) for i in range(8 - fill, 8)])
    assert slow_slip(orders, 4, 2).startswith("at slot 7 stage 2 waits for F2 while B1 is ready")
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


def test_formula_slips():
    # budgets of p or more, where 1F1B's 2(m + p - 1) is the right count
    cases = [(p, m, k) for p in range(1, 5) for m in range(1, 7) for k in range(p, p + 3)]
    assert formula_slip(fits(lambda p, m, k: 2 * (m + p - 1), cases)) is None
    assert formula_slip(fits(lambda p, m, k: 2 * (m + p), cases)) == (
        "the formula gives 2 slot(s) more than the timeline in every pipeline"
    )
    assert "not a whole number" in formula_slip(fits(lambda p, m, k: 2 * (m + p - 1) + (m % 2) / 2, cases))
    # wrong only where the budget is above p
    assert "right for every budget up to p, wrong above it" in formula_slip(
        fits(lambda p, m, k: 2 * (m + p - 1) + (k > p), cases)
    )
    assert formula_slip(fits(lambda p, m, k: None, cases)) is None


def test_formula_slips_below_p():
    # made-up counts for budgets below p: 1F1B's count, and a count right only where k divides m
    cases = {(4, 8, 2): 34, (4, 6, 3): 20, (5, 7, 2): 40, (3, 5, 5): 14}
    assert "1F1B's 2(m + p - 1) slots whatever the budget" in formula_slip(
        {(p, m, k): (2 * (m + p - 1), slots) for (p, m, k), slots in cases.items()}
    )
    right_where_even = {(p, m, k): (slots if m % min(k, p) == 0 else slots + 3) for (p, m, k), slots in cases.items()}
    assert "right where min(budget, p) divides the number of micro-batches" in formula_slip(
        {case: (got, cases[case]) for case, got in right_where_even.items()}
    )
