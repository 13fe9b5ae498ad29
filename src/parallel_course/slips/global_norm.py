"""Lab 15: the global gradient norm and clipping, by hand, over a (dp, tp, pp) layout: the checks, and
the recognisers that name the slip a wrong result points to.

``norm_lines`` and ``clip_lines`` check a student's ``global_norm(pieces, layout)`` and ``clip_(pieces,
layout, max_norm)`` with the gradients of ``parallel_course.slips.norm_layout``, through a ``run``
function that calls them on every rank of a layout and returns what came back (``Run``):
``simulated_run`` on threads (``simulated_group``: a rank that leaves a collective waiting is named at
once), or the launched checker's, on real process groups. Each returns PASS lines up to the first FAIL,
which names the slip: the norm's per-rank values read on probes (a rank's own norm, a copy counted N
times, stages or tp pieces or experts never reduced, norms added instead of their squares, ...), the
factor each rank scaled each piece by (a local norm, an unclamped coefficient, copies left unscaled),
and which ranks stepped on a non-finite gradient. The in-kernel check cells call ``check_global_norm``
and ``check_clip``: one process first (on the calling thread), then the 12 ranks of dp 3 × tp 2 × pp 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from parallel_course.checks import CheckFailed
from parallel_course.slips import simulated_group
from parallel_course.slips.norm_layout import (
    LAB,
    ONE,
    ClipCase,
    Piece,
    Probe,
    Sizes,
    clip_cases,
    pieces_of,
    probes,
    simulated_layouts,
    step_gradient,
)

# Relative tolerance of a norm: float32 sums of squares in another order differ by about 1e-7.
RTOL = 1e-5
# What a norm's collectives need: a few sums of squares per rank, never the gradients.
MAX_ELEMENTS = 16
# The collectives the lab's code may call (simulated on threads).
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "barrier")


# --- running the student's code on every rank -----------------------------------------------------


@dataclass
class Run:
    """What a function returned on every rank (``results``), the pieces each rank held afterwards, the
    elements each rank gave to collectives, and what went wrong: ``error`` (an exception a rank raised),
    ``problem`` (a sentence: the ranks wait forever, a collective called differently, a call refused)."""

    results: list = field(default_factory=list)
    pieces: list[list[Piece]] = field(default_factory=list)
    elements: list[int] = field(default_factory=list)
    error: BaseException | None = None
    problem: str | None = None


RunFunction = Callable[..., Run]


def simulated_run(function: Callable, grads: dict[str, torch.Tensor], sizes: Sizes, *extra) -> Run:
    """``function(pieces, layout, *extra)`` on every rank of ``sizes``, one thread each, the collectives
    simulated between them; a group of one on the calling thread (``one_rank``)."""
    pieces = [pieces_of(grads, sizes, rank) for rank in range(sizes.world)]
    inputs = [(pieces[rank], layout, *extra) for rank, layout in enumerate(simulated_layouts(sizes))]
    if sizes.world == 1:
        return _alone(function, pieces, inputs[0])
    outcome = simulated_group.simulate(function, inputs, allowed=(), collectives=COLLECTIVES, bound_s=30)
    problem = None
    if outcome.deadlock:
        # Those that left first: they are the ones the others wait for.
        left = [line for line in outcome.deadlock if " returned " in line]
        waits = [line for line in outcome.deadlock if " returned " not in line]
        shown = left[:4] + waits[: max(1, 4 - len(left))]
        more = "; ..." if len(shown) < len(outcome.deadlock) else ""
        problem = (
            f"the ranks wait forever ({'; '.join(shown)}{more}): every rank must call the same collectives "
            "on each of its groups, in the same order, whatever its own gradients hold"
        )
    elif outcome.mismatch:
        problem = (
            f"the ranks of a group call different collectives at the same point ({'; '.join(outcome.mismatch)}): "
            "every rank of a group must call the same collective, on a tensor of the same size"
        )
    elif outcome.forbidden:
        problem = _not_in_this_lab(function, outcome.forbidden[1])
    elements = [sum(c.numel for c in outcome.collectives if rank in c.ranks) for rank in range(sizes.world)]
    return Run(outcome.results, pieces, elements, outcome.error, problem)


def _not_in_this_lab(function: Callable, name: str) -> str:
    return (
        f"{getattr(function, '__name__', 'your function')} calls dist.{name}: this lab's code needs only "
        f"{', '.join('dist.' + c for c in COLLECTIVES[:-1])} (each with group=)"
    )


class NotInThisLab(RuntimeError):
    """A call of torch.distributed that the lab's code does not need, made in a group of one."""


@contextmanager
def one_rank():
    """While it lasts, torch.distributed as a group of one on this thread: each of COLLECTIVES returns at
    once (a sum over one rank is its input), any other collective or point-to-point call raises
    NotInThisLab. Nothing is kept from one call to the next: what one call does cannot change another's
    (the course's leak search tries many functions in the place of the first call, here)."""

    def alone(group) -> None:
        if group is not None and getattr(group, "ranks", None) != (0,):
            raise ValueError(f"group= must be one of this rank's groups, got {group!r}")

    def finished(async_op):
        return _Done() if async_op else None

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        alone(group)
        return finished(async_op)

    def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
        alone(group)
        return finished(async_op)

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        alone(group)
        tensor_list[0].copy_(tensor)
        return finished(async_op)

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        alone(group)
        output_tensor.view(-1).copy_(input_tensor.view(-1))
        return finished(async_op)

    def barrier(group=None, async_op=False, device_ids=None, timeout=None):
        alone(group)
        return finished(async_op)

    def refused(name):
        def call(*args, **kwargs):
            raise NotInThisLab(name)

        return call

    own = dict(
        all_reduce=all_reduce,
        broadcast=broadcast,
        all_gather=all_gather,
        all_gather_into_tensor=all_gather_into_tensor,
        barrier=barrier,
    )
    names = {
        name: refused(name)
        for name in (*simulated_group.COLLECTIVES, *simulated_group.POINT_TO_POINT)
        if hasattr(dist, name)
    }
    names.update(own, get_rank=lambda group=None: 0, get_world_size=lambda group=None: 1)
    saved = {name: getattr(dist, name) for name in names}
    for name, value in names.items():
        setattr(dist, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(dist, name, value)


class _Done:
    """What an async collective of a group of one returns: already done."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _alone(function: Callable, pieces: list[list[Piece]], inputs: tuple) -> Run:
    """``function(*inputs)`` as the one rank of a group of one, on the calling thread."""
    result, error, problem = None, None, None
    with one_rank():
        try:
            result = function(*inputs)
        except NotInThisLab as refused:
            problem = _not_in_this_lab(function, str(refused))
        except Exception as raised:
            error = raised
    return Run([result], pieces, [0], error, problem)


# Which argument of each collective is what this rank gives it.
_GIVEN = {
    "all_reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "barrier": (None, None),
}


@contextmanager
def counted_collectives():
    """While it lasts, dist's collectives of COLLECTIVES count the elements this rank gives them: the
    list it yields gets one number per call (for a launched run; the simulated group counts its own)."""
    elements: list[int] = []
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(name):
        position, keyword = _GIVEN[name]

        def call(*args, **kwargs):
            given = (
                kwargs.get(keyword)
                if keyword in kwargs
                else args[position]
                if position is not None and len(args) > position
                else None
            )
            elements.append(given.numel() if isinstance(given, torch.Tensor) else 0)
            return originals[name](*args, **kwargs)

        return call

    for name in COLLECTIVES:
        setattr(dist, name, counting(name))
    try:
        yield elements
    finally:
        for name, collective in originals.items():
            setattr(dist, name, collective)


def simulated_problem(module, sizes: Sizes) -> str | None:
    """``module.global_norm`` on every case of the norm's check, then ``module.clip_`` on every case of
    clipping's, one thread per rank of ``sizes``: the first run that does not return on every rank (a
    rank that leaves the others waiting, a collective called differently, an error) as a sentence; None
    when every run returns. The student's NotImplementedError is raised."""
    grads, _ = step_gradient()
    runs = [("global_norm", module.global_norm, "one training step's gradient", (grads,))]
    runs += [
        ("global_norm", module.global_norm, f"a gradient non-zero only in {p.what}", (p.grads,)) for p in probes(sizes)
    ]
    runs += [("clip_", module.clip_, c.what, (c.grads, c.max_norm)) for c in clip_cases(sizes)]
    for name, function, what, args in runs:
        problem = _problem(simulated_run(function, *args[:1], sizes, *args[1:]), name)
        if problem:
            return f"{name}, {what}: {problem}"
    return None


# --- reading what came back -----------------------------------------------------------------------


def as_number(value) -> float | None:
    """A norm as a float: a number or a one-element tensor; None otherwise."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().double().cpu())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def close(got: float | None, expected: float, rtol: float = RTOL) -> bool:
    return got is not None and abs(got - expected) <= rtol * abs(expected) + 1e-12


def summary(values: list[float | None]) -> str:
    """The values the ranks returned, each with its ranks: '2.5 on ranks 0, 1; 3 on ranks 2, 3'."""
    groups: list[tuple[float | None, list[int]]] = []
    for rank, value in enumerate(values):
        for known, ranks in groups:
            if (value is None and known is None) or (
                value is not None and known is not None and close(value, known, 1e-6)
            ):
                ranks.append(rank)
                break
        else:
            groups.append((value, [rank]))
    parts = [
        f"{'None' if v is None else f'{v:.4g}'} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
        for v, r in groups
    ]
    if len(groups) == 1 and len(values) > 1:
        return f"{parts[0].split(' on ')[0]} on every rank"
    return "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "")


def varies_along(values: list[float | None], sizes: Sizes) -> list[str]:
    """The axes along which the ranks' values differ (two ranks that differ only there disagree)."""
    found = []
    for axis in ("dp", "tp", "pp"):
        for rank in range(sizes.world):
            if any(not _same(values[rank], values[other]) for other in sizes.group(rank, axis)):
                found.append(axis)
                break
    return found


def _same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and close(a, b, 1e-6))


def local_norms(pieces: list[list[Piece]]) -> list[float]:
    """Each rank's norm of the pieces it holds (float64)."""
    return [math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in held)) for held in pieces]


SQUARED = "that is the square of the norm: take the square root once, at the end"
LOCAL = (
    "a rank's local norm only: each rank returned the norm of the pieces it holds, without the other "
    "ranks' (the other tp pieces, stages and experts)"
)
STAGES = (
    "stages never reduced: each stage's ranks return the norm of their own stage's parameters; the stages "
    "hold different layers, so their squares add up over the pp group too"
)
SHARDS = (
    "the tp pieces never reduced: each tp rank counts only its own piece of a split tensor; the pieces "
    "are different parts of one tensor, so their squares add up over the tp group"
)
OWN_EXPERTS = (
    "the experts never reduced: each dp rank counts only the experts it holds; the dp ranks hold "
    "different experts, so the experts' squares add up over the dp group"
)


def counted(kind: str, count: float, sizes: Sizes) -> str:
    """The sentence for a gradient of one ``kind`` counted ``count`` times (its norm √count too large)."""
    n = round(count)
    factor = f"its norm √{n} = {math.sqrt(n):.3f} × too large"
    dp, tp, pp = sizes.dp, sizes.tp, sizes.pp
    if kind == "tp_split" and n == dp:
        return (
            f"replicated parameters counted {n} times: the {dp} dp ranks each hold the same piece (DDP made "
            f"their gradients equal), and each one's square was added: {factor}; never add up the dp "
            "replicas' squares of the dense gradients"
        )
    if kind == "tp_replicated" and n in (tp, dp, tp * dp):
        who = f"{tp} tp ranks" if n == tp else f"{dp} dp ranks" if n == dp else f"{dp} dp × {tp} tp ranks"
        return (
            f"replicated parameters counted {n} times: a tp_replicated tensor is the same on each of the "
            f"{who} of its stage, and its square was added on each: {factor}; count it once (add it after "
            "the tp reduction, or on tp rank 0 only)"
        )
    if kind == "expert" and n in (tp, tp * pp):
        how = (
            f"on the {tp} tp ranks that hold a copy of it (its square summed over tp as well as dp)"
            if n == tp
            else f"on every rank: its square summed over every rank reaches each of the {tp} tp ranks and {pp} "
            "stages, and the stages' sum adds it once per stage"
        )
        return (
            f"experts counted on every rank: each expert was counted {n} times, {how}: {factor}; sum the "
            "experts' squares over the dp group only, where they are held"
        )
    return f"the {kind} gradients counted {count:.3g} times (their norm {math.sqrt(count):.3f} × the right one)"


def reading(probe: Probe, values: list[float | None], sizes: Sizes) -> str | None:
    """What a probe's per-rank results say about how the norm was counted; None when they are right."""
    expected = probe.expected
    if all(close(v, expected) for v in values):
        return None
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    axes = varies_along(values, sizes)
    if "pp" in axes:
        return STAGES
    if "tp" in axes and probe.kind == "tp_split":
        return SHARDS
    if "dp" in axes and probe.kind == "expert":
        return OWN_EXPERTS
    if axes:
        return f"the ranks disagree along {' and '.join(axes)}: {summary(values)}"
    got = values[0]
    if close(got, expected * expected):
        return SQUARED
    if len(probe.parts) == 2 and close(got, sum(probe.parts)):
        a, b = probe.parts
        return (
            f"norms added instead of their squares, across {probe.across}: {a:g} + {b:g} = {a + b:g}, not "
            f"√({a:g}² + {b:g}²) = {expected:g}; add up the squares, and take the root once, at the end"
        )
    count = (got / expected) ** 2
    if abs(count - round(count)) < 1e-3 and round(count) > 1:
        return counted(probe.kind, count, sizes)
    if count < 1 and abs(1 / count - round(1 / count)) < 1e-3:
        n = round(1 / count)
        return (
            f"averaged where it should add: a sum of squares reduced with ReduceOp.AVG (÷{n}); the squares of "
            "different pieces add up: reduce them with ReduceOp.SUM"
        )
    return f"the norm of this gradient is {got / expected:.3f} × the expected"


def _problem(run: Run, name: str) -> str | None:
    """A sentence for a run that did not return on every rank. The student's NotImplementedError is raised
    again, naming the function still to write: an unfinished lab stops at its stubs."""
    if isinstance(run.error, NotImplementedError):
        raise NotImplementedError(f"{_raised_by(run.error)} is not written yet (it raises NotImplementedError)")
    if run.problem:
        return run.problem
    if run.error is not None:
        return f"{name} raised {type(run.error).__name__}: {run.error}"
    return None


def _raised_by(error: BaseException) -> str:
    """The function in which ``error`` was raised: the last frame of its traceback."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_qualname if tb is not None else "your code"


# --- the checks -----------------------------------------------------------------------------------


def norm_lines(global_norm: Callable, sizes: Sizes, run: RunFunction) -> list[str]:
    """The verdicts on ``global_norm`` over ``sizes``, through ``run``: PASS lines, up to the first FAIL."""
    grads, expected = step_gradient()
    what = f"global_norm on {sizes}"
    step = run(global_norm, grads)
    problem = _problem(step, "global_norm")
    if problem:
        return [f"FAIL {what}: {problem}"]
    values = [as_number(v) for v in step.results]
    if not all(close(v, expected) for v in values):
        slip = step_slip(global_norm, sizes, run, values, step)
        return [
            f"FAIL {what}, one training step's gradient: expected torch's norm of the whole model, "
            f"{expected:.4g}, on every rank; got {summary(values)}" + (f": {slip}" if slip else "")
        ]
    lines = [
        f"PASS {what}, one training step's gradient: torch's norm of the whole model, {expected:.4g}, "
        f"on every rank (relative difference <= {RTOL:g})"
    ]
    if sizes.world == 1:
        return lines
    most = max(step.elements)
    if most > MAX_ELEMENTS:
        return lines + [
            f"FAIL global_norm's collectives: a rank gave them {most:,} elements in all (the model has "
            f"{sum(g.numel() for g in grads.values()):,} gradient elements): the norm needs only sums "
            f"of squares, a few numbers per rank (at most {MAX_ELEMENTS}); reduce squares, never gather "
            "the gradients"
        ]
    lines.append(
        f"PASS global_norm's collectives: at most {most} element(s) per rank, sums of squares (at most {MAX_ELEMENTS})"
    )
    checked = probes(sizes)
    for probe in checked:
        result = run(global_norm, probe.grads)
        problem = _problem(result, "global_norm")
        if problem:
            return lines + [f"FAIL {what}, a gradient non-zero only in {probe.what}: {problem}"]
        values = [as_number(v) for v in result.results]
        if not all(close(v, probe.expected) for v in values):
            slip = reading(probe, values, sizes)
            return lines + [
                f"FAIL {what}, a gradient non-zero only in {probe.what}: expected {probe.expected:g} on "
                f"every rank, got {summary(values)}" + (f": {slip}" if slip else "")
            ]
    lines.append(
        f"PASS {what}, {len(checked)} gradients non-zero in one or two places (a split piece, a replicated "
        "tensor, an expert; 3 and 4 across tp ranks, stages, kinds and experts): each one's norm on every rank"
    )
    return lines


def step_slip(global_norm: Callable, sizes: Sizes, run: RunFunction, values: list, step: Run) -> str | None:
    """The slip behind a wrong norm of the training step: the rank's own norm, the square, else the
    first probe whose result names one."""
    if any(v is None for v in values):
        kinds = sorted({type(r).__name__ for r, v in zip(step.results, values) if v is None})
        return f"global_norm returned {', '.join(kinds)}: return the norm, a one-element tensor or a number"
    expected = step_gradient()[1]
    if sizes.world > 1 and all(close(v, local) for v, local in zip(values, local_norms(step.pieces))):
        return LOCAL
    if all(close(v, expected * expected) for v in values):
        return SQUARED
    for probe in probes(sizes) if sizes.world > 1 else []:
        result = run(global_norm, probe.grads)
        if _problem(result, "global_norm"):
            continue
        found = reading(probe, [as_number(v) for v in result.results], sizes)
        if found:
            return found
    return None


def coefficients(before: list[Piece], after: list[Piece]) -> list[float | None]:
    """Per piece, the number c with after = c · before (None where no one number fits)."""
    found = []
    for b, a in zip(before, after):
        x, y = b.grad.double().reshape(-1), a.grad.detach().double().cpu().reshape(-1)
        if x.shape != y.shape or not torch.isfinite(y).all():
            found.append(None)
            continue
        c = (x @ y / (x @ x)).item() if (x @ x) > 0 else 1.0
        found.append(c if (y - c * x).abs().max().item() <= 1e-6 + 1e-5 * y.abs().max().item() else None)
    return found


def clip_lines(clip: Callable, sizes: Sizes, run: RunFunction) -> list[str]:
    """The verdicts on ``clip_`` over ``sizes``, through ``run``: PASS lines, up to the first FAIL."""
    lines, norm = [], step_gradient()[1]
    for case in clip_cases(sizes)[: 1 if sizes.world == 1 else None]:
        what = f"clip_ on {sizes}, {case.what} ({norm:.4g}, max_norm {case.max_norm:.4g})"
        result = run(clip, case.grads, case.max_norm)
        problem = _problem(result, "clip_")
        if problem:
            return lines + [f"FAIL {what}: {problem}"]
        steps = [
            r
            if isinstance(r, bool)
            else bool(r)
            if isinstance(r, torch.Tensor) and r.dtype == torch.bool and r.numel() == 1
            else None
            for r in result.results
        ]
        if any(s is None for s in steps):
            kinds = sorted({type(r).__name__ for r, s in zip(result.results, steps) if s is None})
            return lines + [
                f"FAIL {what}: clip_ returned {', '.join(kinds)}: return True (the optimizer may step) or "
                "False (skip the step)"
            ]
        if case.step is False:
            slip = nonfinite_slip(steps, case, sizes, result)
            if slip:
                return lines + [
                    f"FAIL {what}: expected False (skip the step) on every rank, got {_flags(steps)}: {slip}"
                ]
            lines.append(f"PASS {what}: every rank skips the step")
            continue
        if not all(steps):
            return lines + [
                f"FAIL {what}: expected True (the step goes on, its gradient clipped) on every rank, got "
                f"{_flags(steps)}"
            ]
        expected = [pieces_of(case.expected, sizes, rank) for rank in range(sizes.world)]
        wrong = [rank for rank in range(sizes.world) if not _same_pieces(result.pieces[rank], expected[rank])]
        if wrong:
            slip = clip_slip(case, sizes, result)
            how = "scaled as torch.nn.utils.clip_grad_norm_ scales it" if case.max_norm < norm else "left as it was"
            return lines + [
                f"FAIL {what}: expected every piece {how}, on every rank; rank(s) {wrong[:6]}"
                f"{'...' if len(wrong) > 6 else ''} differ" + (f": {slip}" if slip else "")
            ]
        done = (
            "every piece scaled by max_norm / norm, as clip_grad_norm_ does"
            if case.max_norm < norm
            else "every piece left as it was"
        )
        lines.append(f"PASS {what}: {done}, on every rank")
    return lines


def _flags(steps: list[bool]) -> str:
    true = [r for r, s in enumerate(steps) if s]
    false = [r for r, s in enumerate(steps) if not s]
    if not false:
        return "True on every rank"
    if not true:
        return "False on every rank"
    return f"True on rank(s) {true}, False on rank(s) {false}"


def _same_pieces(got: list[Piece], expected: list[Piece]) -> bool:
    if len(got) != len(expected):
        return False
    for g, e in zip(got, expected):
        x, y = g.grad.detach().double().cpu(), e.grad.double()
        if x.shape != y.shape or not ((x - y).abs().max().item() <= 1e-6 + 1e-5 * y.abs().max().item()):
            return False
    return True


def nonfinite_slip(steps: list[bool], case: ClipCase, sizes: Sizes, result: Run) -> str | None:
    """Why ranks stepped on a non-finite gradient; None when every rank skipped."""
    if not any(steps):
        return None
    holders = [
        rank
        for rank, held in enumerate(result.pieces)
        if any(p.name == case.bad and not torch.isfinite(p.grad).all() for p in held)
    ]
    skipped = [rank for rank, s in enumerate(steps) if not s]
    if skipped and skipped == holders:
        return (
            "each rank tested its own gradients: only the ranks holding the non-finite value skip, the others "
            "step on (their gradients scaled by max_norm / inf = 0, or NaN); test the global norm, the same on every "
            "rank (an inf or a NaN anywhere makes it non-finite everywhere), so that every rank skips alike"
        )
    if not skipped:
        return (
            "a non-finite norm not skipped: every rank steps, its gradients scaled by max_norm / inf = 0 or by "
            "NaN (AdamW would still move every weight, or make it NaN); return False when the global norm is not "
            "finite (torch.isfinite), on every rank alike"
        )
    return "the ranks do not skip alike: decide from the global norm, the same on every rank"


def clip_slip(case: ClipCase, sizes: Sizes, result: Run) -> str | None:
    """The slip behind wrong clipped pieces, from the factor each rank scaled each piece by."""
    before = [pieces_of(case.grads, sizes, rank) for rank in range(sizes.world)]
    factors = [coefficients(b, a) for b, a in zip(before, result.pieces)]
    norm = step_gradient()[1]
    right = min(1.0, case.max_norm / (norm + 1e-6))
    if any(f is None for per_rank in factors for f in per_rank):
        return "a piece is not a multiple of its gradient: clipping multiplies every piece by one number"
    if all(abs(f - 1) < 1e-6 for per_rank in factors for f in per_rank) and right < 1:
        return (
            "the gradients were not changed: clip_ scales the pieces it is given in place (piece.grad.mul_(...)), "
            "or sets piece.grad"
        )
    for rank, per_rank in enumerate(factors):
        if max(per_rank) - min(per_rank) > 1e-6 * max(per_rank):
            kinds = sorted({p.kind for p, f in zip(before[rank], per_rank) if abs(f - right) > 1e-6 * right})
            return (
                f"rank {rank} scaled its pieces by different factors ({min(per_rank):.4g} to {max(per_rank):.4g}; its "
                f"{', '.join(kinds)} pieces off): every rank scales every piece it holds, its copies of replicated "
                "tensors too, else the copies drift apart"
            )
    per_rank = [f[0] for f in factors]
    if max(per_rank) - min(per_rank) > 1e-6 * max(per_rank):
        local = local_norms(before)
        if all(abs(f - min(1.0, case.max_norm / (n + 1e-6))) <= 1e-5 for f, n in zip(per_rank, local)):
            return (
                "clipped with each rank's local norm: the ranks scale by different factors "
                f"({min(per_rank):.3g} to {max(per_rank):.3g}, max_norm / their own norm), so the copies of a tensor "
                "drift apart and the model is no longer one model; clip with the global norm, the same on every rank"
            )
        spread = f"{min(per_rank):.3g} to {max(per_rank):.3g}"
        return f"the ranks scale by different factors ({spread}): clip with the global norm"
    got = per_rank[0]
    if got > 1 + 1e-6:
        return (
            f"the gradients grew ×{got:.3g} = max_norm / norm: clamp the coefficient at 1 (min(1, max_norm / "
            "norm)): clipping only ever scales a gradient down"
        )
    return (
        f"every piece scaled by {got:.4g} where max_norm / (norm + 1e-6) = {right:.4g}: the coefficient uses a norm "
        f"{right / got:.3g} × the global one"
    )


# --- the in-kernel check cells ------------------------------------------------------------------


def _check(lines_of: Callable[[Sizes, RunFunction], list[str]]) -> None:
    """Print the PASS lines of one process, then of the lab's 12 ranks; raise the first FAIL."""
    for sizes in (ONE, LAB):

        def run(function, grads, *extra, sizes=sizes):
            return simulated_run(function, grads, sizes, *extra)

        for line in lines_of(sizes, run):
            if line.startswith("FAIL"):
                raise CheckFailed(line)
            print(line)


def check_global_norm(global_norm: Callable) -> None:
    """Lab 15's first check cell: ``global_norm`` in one process (on this thread), then on the 12
    ranks of dp 3 × tp 2 × pp 2 (threads, the collectives simulated)."""
    _check(lambda sizes, run: norm_lines(global_norm, sizes, run))


def check_clip(clip: Callable) -> None:
    """Lab 15's second check cell: ``clip_`` likewise."""
    _check(lambda sizes, run: clip_lines(clip, sizes, run))
