"""Lab 13 (causal ring attention): the likely slips, recognised from what the student's code did.

- ``check_merge``: the in-kernel check of ``merge``: two partial attention results (over two blocks
  of keys) merged, against attention over all the keys at once (``F.scaled_dot_product_attention``
  for the output, the log-sum-exp of all the scores for the lse), once with ordinary scores and
  once with scores so large that ``exp`` overflows in float32;
- ``merge_slip``: what a wrong merge computed: the plain average or the sum of the two outputs,
  weights not divided by their sum, or swapped; the lse not updated (the first one returned), the
  larger one or the sum of the two; ``exp`` overflowed;
- ``traced``: a lab module's ``attend``, ``ring_step`` and ``merge`` recorded while its
  ``ring_attention`` runs: which key block each call saw (found by its values), with which mask;
- ``ring_slip``: what those records point to: K/V sent the wrong way round, the source block off
  by one step, the wrong mask on a block (the rank's own: causal; earlier: full; later: skipped),
  a block left out, a merge slip, the running (out, lse) not carried from one merge to the next.

``simulated_problem`` runs the ring first on threads, one per rank (``simulated_group``): a ring that
waits forever is found the moment every rank waits, not after a timeout (a rank that leaves the
ring early, sends and receives not posted together), and so are a collective in place of the ring,
a receive into the tensor being sent, blocks sent elsewhere than to the right neighbour, and the
course's own ring (``parallel_course.context_parallel``) used in place of the student's.

Nothing here merges two partial results: the checks compare with attention over all the keys.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from parallel_course.checks import check_close, failure
from parallel_course.slips.simulated_group import simulate

# Two results agree when they differ by at most this, relative to the larger one's largest element.
RTOL = 1e-4
ATOL = 1e-5


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> bool:
    if a.shape != b.shape or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return False
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12)
    return (a - b).abs().max().item() <= rtol * scale


def _attention_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q to all of k (no mask), by its definition: (out, lse), in float64."""
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v.double(), lse


def merge_slip(got: Sequence[torch.Tensor], parts: Sequence[torch.Tensor]) -> str | None:
    """The slip that ``got`` (merge's ``(out, lse)``) points to, for ``parts`` = (out_a, lse_a, out_b,
    lse_b) it was given; None when it is none of the slips known here."""
    out, lse = (t.detach().double() for t in got)
    out_a, lse_a, out_b, lse_b = (t.detach().double() for t in parts)
    if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
        return (
            "it returned inf or nan: did exp() overflow? exp(100) is beyond float32; compute with differences "
            "of lse values (exp(lse_a - lse)), and the lse with torch.logaddexp, never log(exp(a) + exp(b))"
        )
    weight_a, weight_b = lse_a.exp()[..., None], lse_b.exp()[..., None]
    outs = {
        "it averages the two outputs: each must be weighted by its share of the softmax's denominator, "
        "exp(lse_part - lse) (a block with larger scores counts more)": (out_a + out_b) / 2,
        "it adds the two outputs: each must be weighted by its share of the softmax's denominator, "
        "exp(lse_part - lse), and the weights sum to 1": out_a + out_b,
        "its weights exp(lse_a) and exp(lse_b) are not divided by their sum exp(lse): "
        "use exp(lse_a - lse) and exp(lse_b - lse)": weight_a * out_a + weight_b * out_b,
    }
    total = weight_a + weight_b
    if torch.isfinite(total).all() and total.min() > 0:
        outs["the weights are swapped: out_a goes with exp(lse_a - lse), out_b with exp(lse_b - lse)"] = (
            weight_b * out_a + weight_a * out_b
        ) / total
    for slip, value in outs.items():
        if _close(out, value):
            return f"the output: {slip}"
    lses = {
        "it is lse_a unchanged: the merged lse is log(exp(lse_a) + exp(lse_b)) (torch.logaddexp), so that the "
        "next merge weighs this result by all the keys it covers": lse_a,
        "it is lse_b unchanged: the merged lse is log(exp(lse_a) + exp(lse_b)) (torch.logaddexp)": lse_b,
        "it is the larger of the two: the merged lse is log(exp(lse_a) + exp(lse_b)) (torch.logaddexp)": torch.maximum(
            lse_a, lse_b
        ),
        "it is lse_a + lse_b: the denominators add, so the merged lse is log(exp(lse_a) + exp(lse_b)) "
        "(torch.logaddexp)": lse_a + lse_b,
    }
    for slip, value in lses.items():
        if not torch.equal(lse_a, lse_b) and _close(lse, value):
            return f"the lse: {slip}"
    return None


def _merge_case(merge, what: str, seed: int, offsets: tuple[float, float, float], atol: float) -> None:
    """One check of ``merge``: 5 queries against two blocks of keys, 6 and 3. Feature 0 is a constant
    ``offsets`` = (in q, in block a's keys, in block b's): it adds q0 * k0 / sqrt(8) to every score of
    a block, which moves its lse and not its output; blocks with different offsets weigh differently."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(2, 2, 5, 8, generator=generator),
        *(torch.randn(2, 2, 9, 8, generator=generator) for _ in "kv"),
    )
    q[..., 0], k[..., :6, 0], k[..., 6:, 0] = offsets
    out_a, lse_a = _attention_parts(q, k[:, :, :6], v[:, :, :6])
    out_b, lse_b = _attention_parts(q, k[:, :, 6:], v[:, :, 6:])
    parts = [t.float() for t in (out_a, lse_a, out_b, lse_b)]
    expected_out = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).float()
    expected_lse = _attention_parts(q, k, v)[1].float()
    got = merge(*(t.clone() for t in parts))
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise failure(what, f"expected a tuple (out, lse) of two tensors, got {type(got).__name__}")
    slip = merge_slip(got, parts)
    check_close(f"{what}: out", got[0], expected_out, atol, slip)
    check_close(f"{what}: lse", got[1], expected_lse, atol, slip)


def check_merge(merge) -> None:
    """The check of ``merge(out_a, lse_a, out_b, lse_b)``: PASS lines, or CheckFailed naming the slip."""
    base = "merge of 2 key blocks (6 and 3 keys) vs attention over all 9"
    _merge_case(merge, f"{base}, lse about 2", seed=0, offsets=(1.0, 0.0, 1.5), atol=ATOL)
    # float32 holds a number near 100 to about 1e-5: the tolerance follows.
    _merge_case(merge, f"{base}, lse about 100 (exp overflows float32)", seed=1, offsets=(17.0, 17.0, 16.5), atol=1e-4)


# --- the ring, traced -------------------------------------------------------------------------


def rule(rank: int, block: int) -> str:
    """What a rank does with a block of keys in causal attention, contiguous chunks: its own block
    causal, an earlier one in full, a later one skipped."""
    return "causal" if block == rank else "full" if block < rank else "skip"


def block_of(tensor: torch.Tensor, blocks: Sequence[torch.Tensor]) -> int | None:
    """The index of the block whose values ``tensor`` holds, or None."""
    t = tensor.detach()
    return next((j for j, b in enumerate(blocks) if t.shape == b.shape and torch.equal(t, b)), None)


def _same(pair, other) -> bool:
    return other is not None and all(
        a.shape == b.shape and torch.equal(a.detach(), b.detach()) for a, b in zip(pair, other)
    )


@contextlib.contextmanager
def traced(module, k_blocks: Sequence[torch.Tensor]):
    """``module``'s ``attend``, ``ring_step`` and ``merge`` recorded while the block runs; yields the list
    of events, in order: ("attend", block, causal), ("receive", block), ("merge", slip, carried) where
    carried says whether one of merge's two pairs is the previous result (of a merge, or for the first
    merge, of an attend), and ("start", zeros) for a first merge that starts from zeros."""
    events, originals = [], {name: getattr(module, name) for name in ("attend", "ring_step", "merge")}
    last = {"result": None, "attended": []}

    def attend(q, k, v, causal):
        result = originals["attend"](q, k, v, causal)
        events.append(("attend", block_of(k, k_blocks), bool(causal)))
        last["attended"].append(result)
        return result

    def ring_step(k, v):
        result = originals["ring_step"](k, v)
        events.append(("receive", block_of(result[0], k_blocks)))
        return result

    def merge(out_a, lse_a, out_b, lse_b):
        result = originals["merge"](out_a, lse_a, out_b, lse_b)
        pairs = [(out_a, lse_a), (out_b, lse_b)]
        if last["result"] is None:
            carried = any(_same(p, r) for p in pairs for r in last["attended"])
            zeros = any(not p[0].detach().any() and not p[1].detach().any() for p in pairs)
            if zeros:
                events.append(("start", True))
        else:
            carried = any(_same(p, last["result"]) for p in pairs)
        slip = merge_slip(result, [t.detach() for t in (out_a, lse_a, out_b, lse_b)])
        events.append(("merge", slip, carried))
        last["result"] = tuple(t.detach() for t in result)
        return result

    module.attend, module.ring_step, module.merge = attend, ring_step, merge
    try:
        yield events
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


def _treatments(rank: int, events: list) -> list[tuple[int | None, str]]:
    """Per step (the own block first, then each block received): (the block, what was done with it)."""
    steps = [[rank, "skip"]]
    for event in events:
        if event[0] == "receive":
            steps.append([event[1], "skip"])
        elif event[0] == "attend":
            done = "causal" if event[2] else "full"
            steps[-1][1] = done if event[1] == steps[-1][0] else f"block {event[1]}"
    return [tuple(s) for s in steps]


def _as_if(rank: int, block: int, done: str) -> bool:
    """Whether ``done`` is what a rank's loop does with ``block``: its rule, or for the own block (which the
    loop may leave to step 0) a skip."""
    return done == rule(rank, block) or (block == rank and done == "skip")


def ring_slip(traces: Sequence[list]) -> str | None:
    """The slip that every rank's events (``traces[rank]``, from ``traced``) point to, or None."""
    n = len(traces)
    for rank, events in enumerate(traces):
        for event in events:
            if event[0] == "merge" and event[1]:
                return f"rank {rank}'s merge is wrong: {event[1]}"
    for rank, events in enumerate(traces):
        if any(e[0] == "start" for e in events):
            return (
                f"rank {rank}'s first merge starts from out = 0, lse = 0: that counts an empty block as keys "
                "with score 0; start from the own block's (out, lse) (or from lse = -inf)"
            )
        merges = [e for e in events if e[0] == "merge"]
        if any(not e[2] for e in merges[1:]):
            return (
                f"on rank {rank}, a merge does not get the previous merge's result: keep the running (out, lse) "
                "and pass both to the next merge (out, lse = merge(out, lse, ...))"
            )
    received = [[e[1] for e in events if e[0] == "receive"] for events in traces]
    if n > 2 and all(len(r) == n - 1 for r in received):
        if all(r == [(rank + s) % n for s in range(1, n)] for rank, r in enumerate(received)):
            return (
                "K/V travel the wrong way round: rank r received block r + 1, then r + 2, ...: send to the right "
                "((rank + 1) % N) and receive from the left ((rank - 1) % N)"
            )
    if any(len(r) != n - 1 for r in received):
        counts = sorted({len(r) for r in received})
        return (
            f"ring_step was called {' or '.join(map(str, counts))} time(s) on a rank: ring_attention calls it "
            f"N - 1 = {n - 1} times, which brings every other block once"
        )
    steps = [_treatments(rank, events) for rank, events in enumerate(traces)]
    right = all(done == rule(rank, block) for rank, rank_steps in enumerate(steps) for block, done in rank_steps)
    for shift, sign in ((1, "+"), (-1, "-")):
        shifted = all(
            _as_if(rank, (block + shift) % n, done)
            for rank, rank_steps in enumerate(steps)
            for s, (block, done) in enumerate(rank_steps)
            if s > 0 and block is not None
        )
        if shifted and not right:
            return (
                f"a rotation off by one: every block j received was treated as block j {sign} 1, as if its source "
                f"were (rank - step {sign} 1) % N; after s steps a rank holds the block of rank (rank - s) % N"
            )
    for rank, rank_steps in enumerate(steps):
        for block, done in rank_steps:
            if block is None:
                continue
            if done.startswith("block"):
                return f"rank {rank} attended to another block than the one it held ({done} with block {block})"
            expected = rule(rank, block)
            if done == expected:
                continue
            if block == rank:
                how = "without the causal mask" if done == "full" else "not at all"
                return (
                    f"rank {rank} attended to its own block {how}"
                    ": the block on the diagonal needs the causal mask (a query sees only keys up to itself)"
                )
            if block < rank:
                return (
                    f"rank {rank} attended to block {block}, an earlier one, "
                    + ("with the causal mask" if done == "causal" else "not at all")
                    + ": every key of an earlier block comes before every query of this one, so no mask"
                )
            return (
                f"rank {rank} attended to block {block}, a later one ({done} mask): every key there comes after "
                "every query here; skip later blocks"
            )
    return None


# --- the ring, on threads first --------------------------------------------------------------------


COURSE = "parallel_course.context_parallel"


def course_ring_used(module) -> list[str]:
    """The names in ``module`` that are the course's own context parallelism (the module, or what it defines)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if getattr(value, "__name__", None) == COURSE or getattr(value, "__module__", None) == COURSE
    )


@contextlib.contextmanager
def course_calls():
    """The functions of the course's context parallelism called while the block runs (imported inside a
    function too): yields the set of their names."""
    course, called = importlib.import_module(COURSE), set()
    functions = {name: f for name, f in vars(course).items() if inspect.isfunction(f) and f.__module__ == COURSE}

    def recording(name, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            called.add(name)
            return function(*args, **kwargs)

        return call

    for name, function in functions.items():
        setattr(course, name, recording(name, function))
    try:
        yield called
    finally:
        for name, function in functions.items():
            setattr(course, name, function)


def deadlock_slip(waits: Sequence[str], world_size: int) -> str:
    """Who waits for whom when the ring deadlocked: what to check."""
    left = [line for line in waits if " returned after " in line]
    if left:
        return (
            f"{left[0]}, while its neighbour still waits for a block from it: every rank takes part in all "
            f"N - 1 = {world_size - 1} steps, passing on blocks it no longer uses (a later block is skipped, "
            "not its step)"
        )
    if all(" waits in its send " in line for line in waits):
        return (
            "every rank waits in a blocking send to a neighbour that is sending too: post the sends and the "
            "receives together, in one dist.batch_isend_irecv"
        )
    return "does every rank post one send to the right and one receive from the left per step, for N - 1 steps?"


def simulated_problem(module, q_blocks, k_blocks, v_blocks) -> str | None:
    """``module.ring_attention`` run on one thread per rank (rank r with block r of each): what is wrong
    with how it passes the blocks, as the end of a FAIL line, or None. An exception it raises is left
    to the real run (None), where its traceback shows."""
    used = course_ring_used(module)
    if used:
        return (
            f"your file uses the course's parallel_course.context_parallel ({', '.join(used)}): write the ring "
            "yourself, from dist.P2POp and dist.batch_isend_irecv"
        )
    n = len(q_blocks)
    with course_calls() as called:
        outcome = simulate(
            module.ring_attention, [(q, k.clone(), v.clone()) for q, k, v in zip(q_blocks, k_blocks, v_blocks)]
        )
    if called:
        return (
            f"ring_attention calls the course's parallel_course.context_parallel ({', '.join(sorted(called))}): "
            "write the ring yourself, from dist.P2POp and dist.batch_isend_irecv"
        )
    if outcome.forbidden:
        return (
            f"ring_attention calls dist.{outcome.forbidden[1]}: the keys and values go round the ring, one block "
            "per step from the left neighbour (ring_step), never gathered whole"
        )
    if outcome.aliased:
        rank, index = outcome.aliased
        return (
            f"rank {rank} receives into a tensor it is still sending (its receive #{index}): the block may be "
            "overwritten while it travels; receive into new tensors (torch.empty_like)"
        )
    if outcome.deadlock:
        return f"the ring waits forever ({'; '.join(outcome.deadlock)}): {deadlock_slip(outcome.deadlock, n)}"
    if outcome.error is not None:
        return None
    block = k_blocks[0].numel() + v_blocks[0].numel()
    if n > 2 and all(
        {m.dst for m in outcome.sent(r)} == {(r - 1) % n} and {m.src for m in outcome.received(r)} == {(r + 1) % n}
        for r in range(n)
    ):
        return (
            "K/V travel the wrong way round: every rank sends to its left neighbour and receives from its right; "
            "send to the right ((rank + 1) % N) and receive from the left ((rank - 1) % N)"
        )
    for rank in range(n):
        right, left = (rank + 1) % n, (rank - 1) % n
        to = sorted({m.dst for m in outcome.sent(rank)})
        frm = sorted({m.src for m in outcome.received(rank)})
        elements = sum(m.numel for m in outcome.sent(rank))
        if (to and to != [right]) or (frm and frm != [left]) or elements > (n - 1) * block:
            return (
                f"rank {rank} sends {elements:,} elements to rank(s) {', '.join(map(str, to))} and receives from "
                f"rank(s) {', '.join(map(str, frm))}: a ring passes its block of keys and values ({block:,} elements) "
                f"to the right neighbour (rank {right}) and receives the left one's (rank {left}), N - 1 times"
            )
    return None
