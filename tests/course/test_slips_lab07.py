"""Lab 07a's checks name the likely slips: each injected into the solution, in this process (the
check cell that launches the executor is left out: it checks what the cells before it checked).
A slip may run only some of the cells: a check that follows a failed one must still name its own."""

import pytest

import lab_injection
from lab_injection import cell, first_failure, injected, region
from parallel_course.checks import CheckFailed

LAB = "lab07_pipeline_schedule.ipynb"
# The setup, budget_orders and its two checks, step_slots and its check.
CELLS = ["c02", "c04", "c05", "c05b", "c07", "c08"]
in_kernel = lab_injection.in_kernel

# A first attempt at budget_orders: 1F1B's fixed order (forwards to fill, then one backward, one
# forward), its fill capped at what the stage may hold.
FIXED_ALTERNATION = """    orders = []
    for stage in range(n_stages):
        fill = min(budget, n_stages - stage, n_microbatches)
        order = [("F", i) for i in range(fill)]
        for i in range(n_microbatches - fill):
            order += [("B", i), ("F", fill + i)]
        order += [("B", i) for i in range(n_microbatches - fill, n_microbatches)]
        orders.append(order)
    return orders
"""

# A formula that plays the step out: the slots of the solution's own orders' timeline.
PLAYED_OUT = "    return int(makespan(timeline(budget_orders(n_stages, n_microbatches, budget))))\n"
# The step's slots counted in a loop, one slot at a time.
LOOP_OVER_SLOTS = """    slots = 0
    for stage in range(n_stages):
        for microbatch in range(n_microbatches):
            slots += 1
    return slots
"""
BUDGET_IGNORED = "may_hold_more = f - b < p - stage"
# Past a failed check of the rules: the check of the fewest slots, then the formula's.
AFTER_A_FAILED_RULE = ["c02", "c04", "c05b", "c07", "c08"]

SLIPS = {
    "no cap at p - s": (
        "c04",
        "may_hold_more = f - b < min(budget, p - stage)",
        "may_hold_more = f - b < budget",
        "within the budget of 5, but more than p - s = 3, what 1F1B holds on stage 0: is what a stage holds capped",
    ),
    "one more than allowed": (
        "c04",
        "may_hold_more = f - b < min(budget, p - stage)",
        "may_hold_more = f - b <= min(budget, p - stage)",
        "one more than stage 0 may hold: is a comparison off by one",
    ),
    "a fixed alternation": (
        "c04",
        None,
        FIXED_ALTERNATION,
        "expected 20, got 24: at slot 8 stage 1 waits for F3 while B1 is ready: does a fixed order",
    ),
    "the budget above p": (
        "c07",
        "k = min(budget, p)",
        "k = budget",
        "the formula is right for every budget up to p, wrong above it",
    ),
    "the last group as a full one": (
        "c07",
        "groups = -(-m // k)",
        "groups = m // k",
        "right where min(budget, p) divides the number of micro-batches, wrong where it does not",
    ),
    "a fractional number of groups": (
        "c07",
        "groups = -(-m // k)",
        "groups = m / k",
        "the formula gives 6.66667 slots, not a whole number: a division where a whole number of micro-batches",
    ),
    "1F1B's slots": (
        "c07",
        "return 2 * p * (groups - 1) + 2 * (last + p - 1)",
        "return 2 * (m + p - 1)",
        "the formula gives 1F1B's 2(m + p - 1) slots whatever the budget",
    ),
    "off by a constant": (
        "c07",
        "2 * (last + p - 1)",
        "2 * (last + p)",
        "the formula gives 2 slot(s) more than the timeline in every pipeline",
    ),
    "the step played out": (
        "c07",
        None,
        PLAYED_OUT,
        "step_slots(500, 3000, 2) ran more than 50,000 lines of Python: it plays the step out (it calls budget_orders)",
    ),
    "a loop over the slots": (
        "c07",
        None,
        LOOP_OVER_SLOTS,
        "ran more than 50,000 lines of Python: it plays the step out (a loop over the slots, or over stages",
    ),
    "the budget ignored: a step too short": (
        "c04",
        "may_hold_more = f - b < min(budget, p - stage)",
        BUDGET_IGNORED,
        "FAIL slots of a step, 2 stages, 4 micro-batches, budget 1: expected 16, got 10: the orders hold [2, 1] "
        "micro-batches per stage, more than the [1, 1] allowed: a step that keeps the budget cannot be this short",
    ),
}
# The cells a slip runs, where not all of them.
ONLY = {"the budget ignored: a step too short": AFTER_A_FAILED_RULE}


@pytest.mark.usefixtures("in_kernel")
@pytest.mark.parametrize("slip", SLIPS)
def test_the_check_names_the_slip(slip):
    target, old, new, named = SLIPS[slip]
    cells = ONLY.get(slip, CELLS)
    sources = [cell(LAB, c) for c in cells]
    i = cells.index(target)
    sources[i] = injected(sources[i], old if old is not None else region(sources[i]), new)
    failure = first_failure(sources)
    assert failure.startswith("FAIL "), failure
    assert named in failure, failure


@pytest.mark.usefixtures("in_kernel")
def test_the_formula_is_checked_after_a_failed_check_of_the_orders():
    """The orders check fails (1F1B's orders, over the budget); the cells after it still run to a
    verdict of their own, not a NameError of a name the failed check did not get to define."""
    sources = [cell(LAB, c) for c in CELLS]
    sources[1] = injected(sources[1], "may_hold_more = f - b < min(budget, p - stage)", BUDGET_IGNORED)
    namespace = {}
    for source in sources:
        try:
            lab_injection.run_cell(source, namespace)
        except CheckFailed as failed:
            assert str(failed).startswith("FAIL "), failed
