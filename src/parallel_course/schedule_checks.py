"""Checks of a pipeline schedule written as data (lab 07a): properties of an answer, not a reference.

A schedule is one order per stage, a list of ``("F", i)`` (forward of micro-batch i) and
``("B", i)`` (its backward), as in ``parallel_course.model_parallel``. These checks know what
every correct schedule satisfies, and nothing about how to build one:

- each stage runs the forward and the backward of every micro-batch exactly once, the backward
  after its own forward (it needs that forward's activations);
- a stage never holds more than its budget of micro-batches (forwards run, backwards not yet);
- the orders can run: a forward waits for the previous stage's forward of the same micro-batch, a
  backward for the next stage's backward; orders in which every stage waits for another deadlock;
- a step takes the number of slots a formula predicts (each operation one slot), counted on the
  timeline slot by slot;
- the formula is one: it computes the slots of a long pipeline without playing the step out (the
  lines of Python it runs counted, never timed).

Each ``*_problem`` function returns what is wrong (which stage, which operation, which
dependency) or None; each ``check_*`` function prints ``PASS ...`` or raises ``CheckFailed``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from .checks import failure
from .model_parallel import Op, grid, makespan, timeline

KINDS = ("F", "B")


def _name(op: tuple[str, int]) -> str:
    """("F", 3) as "F3"."""
    return f"{op[0]}{op[1]}"


def _operation(op, stage: int, n_microbatches: int) -> tuple[tuple[str, int] | None, str | None]:
    """``op`` as ("F" or "B", micro-batch), or what is wrong with it."""
    if not isinstance(op, (tuple, list)) or len(op) != 2:
        return None, f'stage {stage} has {op!r} in its order: an operation is ("F", i) or ("B", i)'
    kind, microbatch = op
    if kind not in KINDS or isinstance(microbatch, bool) or not isinstance(microbatch, int):
        return None, f'stage {stage} has {op!r} in its order: an operation is ("F", i) or ("B", i)'
    if not 0 <= microbatch < n_microbatches:
        return None, f"stage {stage} runs {kind}{microbatch}, but the micro-batches are 0..{n_microbatches - 1}"
    return (kind, microbatch), None


def _stage_problem(order, stage: int, n_microbatches: int, budget: int) -> str | None:
    """Each operation once, a backward after its own forward, at most ``budget`` held at a time."""
    seen: set[tuple[str, int]] = set()
    held: list[int] = []
    for op in order:
        op, problem = _operation(op, stage, n_microbatches)
        if problem:
            return problem
        if op in seen:
            return f"stage {stage} runs {_name(op)} twice"
        seen.add(op)
        kind, microbatch = op
        if kind == "B" and ("F", microbatch) not in seen:
            return (
                f"stage {stage} runs B{microbatch} before its own F{microbatch}: "
                "a backward needs the activations its forward kept"
            )
        if kind == "F":
            held.append(microbatch)
            if len(held) > budget:
                names = " ".join(f"F{i}" for i in held)
                return (
                    f"stage {stage} holds {len(held)} micro-batches at F{microbatch} "
                    f"({names}, none of them backward yet): its budget is {budget}"
                )
        else:
            held.remove(microbatch)
    missing = [_name((kind, i)) for kind in KINDS for i in range(n_microbatches) if (kind, i) not in seen]
    if missing:
        return f"stage {stage} never runs {', '.join(missing)}"
    return None


def _dependency(kind: str, stage: int, microbatch: int, n_stages: int) -> tuple[int, tuple[str, int]] | None:
    """The (stage, operation) that must finish before ``kind`` of ``microbatch`` runs on ``stage``."""
    if kind == "F":
        return (stage - 1, ("F", microbatch)) if stage > 0 else None
    return (stage + 1, ("B", microbatch)) if stage < n_stages - 1 else None


def deadlock_problem(orders: Sequence[Sequence[tuple[str, int]]]) -> str | None:
    """None if the orders can run to the end; else which stage waits at which operation for what.

    Assumes every stage's order is complete (``_stage_problem`` found nothing): then only the
    dependencies between stages can stop a stage.
    """
    n_stages = len(orders)
    done: set[tuple[int, tuple[str, int]]] = set()
    position = [0] * n_stages
    progress = True
    while progress:
        progress = False
        for stage, order in enumerate(orders):
            while position[stage] < len(order):
                kind, microbatch = order[position[stage]]
                needed = _dependency(kind, stage, microbatch, n_stages)
                if needed is not None and needed not in done:
                    break
                done.add((stage, (kind, microbatch)))
                position[stage] += 1
                progress = True
    waiting = []
    for stage, order in enumerate(orders):
        if position[stage] < len(order):
            kind, microbatch = order[position[stage]]
            other, op = _dependency(kind, stage, microbatch, n_stages)
            waiting.append(f"stage {stage} waits at {kind}{microbatch} for stage {other}'s {_name(op)}")
    if waiting:
        return "the orders deadlock: " + "; ".join(waiting)
    return None


def _budgets(budget: int | Sequence[int], n_stages: int) -> list[int]:
    """One budget per stage: ``budget`` itself when it is a list, else the same number for every stage."""
    return [budget] * n_stages if isinstance(budget, int) else list(budget)


def schedule_problem(orders, n_stages: int, n_microbatches: int, budget: int | Sequence[int]) -> str | None:
    """What is wrong with ``orders`` as a schedule of ``n_microbatches`` on ``n_stages`` that holds
    at most ``budget`` micro-batches per stage (one number for all, or one per stage), or None."""
    if not isinstance(orders, (list, tuple)) or not all(isinstance(o, (list, tuple)) for o in orders):
        return f"expected a list of {n_stages} orders (one list per stage), got {orders!r}"
    if len(orders) != n_stages:
        return f"expected {n_stages} orders (one per stage), got {len(orders)}"
    for stage, (order, most) in enumerate(zip(orders, _budgets(budget, n_stages))):
        problem = _stage_problem(order, stage, n_microbatches, most)
        if problem:
            return problem
    return deadlock_problem([[tuple(op) for op in order] for order in orders])


def held_per_stage(orders: Sequence[Sequence[tuple[str, int]]]) -> list[int]:
    """Per stage, the most micro-batches held at once along its order (forward run, backward not)."""
    peaks = []
    for order in orders:
        held = peak = 0
        for kind, _ in order:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def check_schedule(
    what: str, orders, n_stages: int, n_microbatches: int, budget: int | Sequence[int], slip: str | None = None
) -> list[Op]:
    """PASS when ``orders`` is a schedule within the budget (per stage, or one for all) that can run;
    returns its timeline. A FAIL names ``slip``, the slip recognised in the orders, if any."""
    problem = schedule_problem(orders, n_stages, n_microbatches, budget)
    if problem:
        raise failure(what, problem, slip)
    ops = timeline([[tuple(op) for op in order] for order in orders])
    print(
        f"PASS {what}: every operation once, no deadlock, held per stage {held_per_stage(orders)} "
        f"(at most {_budgets(budget, n_stages)}), {int(makespan(ops))} slots"
    )
    return ops


def idle_slots(ops: Sequence[Op]) -> list[int]:
    """Per stage, the slots of the step in which it runs nothing, counted on the timeline's grid."""
    return [sum(1 for label in row if not label) for row in grid(ops)]


def slots_problem(ops: Sequence[Op], n_microbatches: int, predicted) -> str | None:
    """Whether a timeline takes ``predicted`` slots: every stage busy 2m of them, idle the rest."""
    slots, idle = int(makespan(ops)), idle_slots(ops)
    if predicted != slots:
        return f"the formula predicts {predicted!r} slots, the timeline takes {slots} (idle per stage: {idle})"
    expected_idle = [predicted - 2 * n_microbatches] * len(idle)
    if idle != expected_idle:
        return f"expected {expected_idle} idle slots per stage, the timeline has {idle}"
    return None


def check_slots(what: str, ops: Sequence[Op], n_microbatches: int, predicted, slip: str | None = None) -> None:
    """PASS when the timeline ``ops`` takes ``predicted`` slots, counted slot by slot. A FAIL names
    ``slip``, the slip recognised in the formula, if any."""
    problem = slots_problem(ops, n_microbatches, predicted)
    if problem:
        raise failure(what, problem, slip)
    bubble = 1 - 2 * n_microbatches / predicted
    print(f"PASS {what}: {predicted} slots, {predicted - 2 * n_microbatches} idle on each stage, bubble {bubble:.4f}")


class _TooManyLines(BaseException):
    """Raised by the line counter to stop a call (a BaseException: a student's ``except Exception`` lets it by)."""


def lines_run(function: Callable, *args, most: int) -> tuple[object, int | None, list[str]]:
    """``function(*args)`` with every line of Python it runs counted, in its own code and in what it
    calls: (its result, the lines run, the names of the functions it called). Stopped once it has run
    ``most`` lines: then the result is None and the count None. Counted, not timed: the same on any machine."""
    count, called = 0, []

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > most:
                raise _TooManyLines
        return local

    def calls(frame, event, arg):
        called.append(frame.f_code.co_name)
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        result = function(*args)
    except _TooManyLines:
        return None, None, called
    finally:
        sys.settrace(previous)
    return result, count, called


def check_formula(what: str, step_slots: Callable, case: tuple[int, int, int], most: int, played=()) -> None:
    """PASS when ``step_slots(*case)``, a long pipeline, runs at most ``most`` lines of Python: a formula,
    or a loop over micro-batches, not a step played out slot by slot. A FAIL names what it called of
    ``played`` (the functions that play a step out: the orders, the timeline)."""
    _, count, called = lines_run(step_slots, *case, most=most)
    if count is None:
        used = [name for name in played if name in called]
        how = f"it calls {', '.join(used)}" if used else "a loop over the slots, or over stages and micro-batches?"
        raise failure(
            what,
            f"step_slots{case} ran more than {most:,} lines of Python: it plays the step out ({how}); "
            "derive the number of slots from p, m and the budget",
        )
    print(f"PASS {what}: step_slots{case} computed without playing the step out (fewer than {most:,} lines run)")
