"""Lab 07a (a pipeline schedule under a memory budget): the likely slips, recognised from the orders
and the formula the student wrote.

- ``budget_slip``: orders that hold more than a stage may: the cap p - s left out (within the
  budget, more than 1F1B holds there), or one micro-batch more than allowed (a comparison off by one);
- ``short_slip``: orders whose step is shorter than the fewest slots: they hold more than allowed;
- ``slow_slip``: valid orders that take more slots than needed: a stage waits, or runs a forward,
  while a backward is ready (a fixed alternation of forwards and backwards), or waits while a
  forward is ready and within what it may hold;
- ``formula_slip``: a slot formula that is off by a constant everywhere, gives 1F1B's slots
  whatever the budget, is wrong only for budgets above p, only where the micro-batches do not
  split evenly, or gives a number of slots that is not whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from parallel_course.model_parallel import makespan, timeline
from parallel_course.schedule_checks import held_per_stage


def _allowed(n_stages: int, budget: int) -> list[int]:
    return [min(budget, n_stages - s) for s in range(n_stages)]


def budget_slip(orders, n_stages: int, budget: int) -> str | None:
    """For orders that hold more than min(budget, p - s) on some stage s: the slip that points to.
    None when they hold no more, or for orders too malformed to count."""
    try:
        held = held_per_stage(orders)
    except (TypeError, ValueError):
        return None
    allowed = _allowed(n_stages, budget)
    if len(held) != n_stages:
        return None
    over = [s for s in range(n_stages) if held[s] > allowed[s]]
    if not over:
        return None
    s = over[0]
    if all(held[t] <= allowed[t] + 1 for t in range(n_stages)) and any(allowed[t] == budget for t in over):
        return f"one more than stage {s} may hold: is a comparison off by one (`<=` where `<` is meant)?"
    if all(h <= budget for h in held):
        return (
            f"within the budget of {budget}, but more than p - s = {n_stages - s}, what 1F1B holds on stage {s}: "
            "is what a stage holds capped at p - s too?"
        )
    return None


def _first_wait(orders, allowed: Sequence[int]) -> tuple[int, int, str, str] | None:
    """(slot, stage, what, which kind was ready) of the earliest slot in which a stage waits, or runs a forward, while a
    backward is ready; or waits while a forward is ready and within what it may hold."""
    ops = timeline(orders)
    n_stages = len(orders)
    start = {(op.kind, op.stage, op.microbatch): int(op.slot) for op in ops}
    running = {(op.stage, int(op.slot)): f"{op.kind}{op.microbatch}" for op in ops}
    n_microbatches = len(orders[0]) // 2

    def done_by(key, t):
        return key in start and start[key] + 1 <= t

    found = []
    for s in range(n_stages):
        for t in range(int(makespan(ops))):
            doing = running.get((s, t), "")
            if doing.startswith("B"):
                continue
            for i in range(n_microbatches):
                after = ("F", s, i) if s == n_stages - 1 else ("B", s + 1, i)
                if done_by(("F", s, i), t) and done_by(after, t) and start[("B", s, i)] > t:
                    if doing:
                        verb = f"runs {doing}"
                    else:
                        waiting = min((op for op in ops if op.stage == s and op.slot > t), key=lambda op: op.slot)
                        verb = f"waits for {waiting.kind}{waiting.microbatch}"
                    found.append((t, s, f"at slot {t} stage {s} {verb} while B{i} is ready", "B"))
                    break
            else:
                if doing:
                    continue
                held = sum(1 for i in range(n_microbatches) if done_by(("F", s, i), t) and start[("B", s, i)] >= t)
                nxt = next((i for i in range(n_microbatches) if start[("F", s, i)] > t), None)
                before = ("F", s - 1, nxt)
                if nxt is not None and held < allowed[s] and (s == 0 or done_by(before, t)):
                    what = f"at slot {t} stage {s} waits while F{nxt} is ready and it holds {held} of {allowed[s]}"
                    found.append((t, s, what, "F"))
    return min(found) if found else None


def short_slip(orders, n_stages: int, budget: int) -> str | None:
    """For orders whose step takes fewer slots than any step within the budget can: they hold more than
    a stage may (the slip), or None when they do not (or cannot be counted)."""
    allowed = _allowed(n_stages, budget)
    try:
        held = held_per_stage(orders)
    except (TypeError, ValueError):
        return None
    if len(held) == n_stages and any(h > a for h, a in zip(held, allowed)):
        return (
            f"the orders hold {held} micro-batches per stage, more than the {allowed} allowed: a step that keeps "
            "the budget cannot be this short (see the check of the rules above)"
        )
    return None


def slow_slip(orders, n_stages: int, budget: int) -> str | None:
    """For valid orders: the first slot in which a stage waits, or runs a forward, while a backward
    is ready, or waits while a ready forward would fit; None when there is none (or the orders
    cannot run)."""
    allowed = _allowed(n_stages, budget)
    try:
        wait = _first_wait([[tuple(op) for op in order] for order in orders], allowed)
    except (TypeError, ValueError, KeyError, IndexError):
        return None
    if wait is None:
        return None
    _, _, what, ready = wait
    if ready == "B":
        return f"{what}: does a fixed order of forwards and backwards make a stage wait for what is not ready yet?"
    return f"{what}: does a stage wait when it could run a forward?"


def _whole(x) -> bool:
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


def formula_slip(results: dict[tuple[int, int, int], tuple[object, int]]) -> str | None:
    """What a slot formula gets wrong, from ``results``: (stages, micro-batches, budget) -> (what the
    formula predicts, the slots the timeline takes). None when it misses nothing or no slip fits."""
    try:
        misses = {case: (got, slots) for case, (got, slots) in results.items() if got != slots}
        if not misses:
            return None
        for (p, m, k), (got, _) in misses.items():
            if not _whole(got):
                return (
                    f"for (p, m, budget) = ({p}, {m}, {k}) the formula gives {got:g} slots, not a whole number: "
                    "a division where a whole number of micro-batches is meant?"
                )
        offsets = {got - slots for got, slots in results.values()}
        if len(offsets) == 1:
            (offset,) = offsets
            more = "more" if offset > 0 else "fewer"
            return f"the formula gives {abs(offset):g} slot(s) {more} than the timeline in every pipeline"
        if all(got == 2 * (m + p - 1) for (p, m, _), (got, _) in results.items()):
            return (
                "the formula gives 1F1B's 2(m + p - 1) slots whatever the budget: with a budget below p, "
                "what does stage 0 wait for?"
            )
        if all(k > p for p, _, k in misses):
            return "the formula is right for every budget up to p, wrong above it: what does a budget above p hold?"
        if all(m % min(k, p) for p, m, k in misses):
            return (
                "the formula is right where min(budget, p) divides the number of micro-batches, wrong where "
                "it does not: what becomes of the micro-batches left over?"
            )
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return None
