"""Lab 07a's checks name the likely slips: each injected into the solution, in this process (the
check cell that launches the executor is left out: it checks what the cells before it checked)."""

import pytest

import lab_injection
from lab_injection import cell, first_failure, injected, region

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
}


@pytest.mark.usefixtures("in_kernel")
@pytest.mark.parametrize("slip", SLIPS)
def test_the_check_names_the_slip(slip):
    target, old, new, named = SLIPS[slip]
    sources = [cell(LAB, c) for c in CELLS]
    i = CELLS.index(target)
    sources[i] = injected(sources[i], old if old is not None else region(sources[i]), new)
    failure = first_failure(sources)
    assert failure.startswith("FAIL "), failure
    assert named in failure, failure
