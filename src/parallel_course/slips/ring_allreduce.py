"""Lab 03 (a ring all-reduce by hand): the likely slips, recognised from what the ring made of every
rank's tensor.

Cut like the ring cuts it (``tensor_split`` into one chunk per rank), each chunk of a result is a
sum of the ranks' inputs on that chunk, each counted some number of times: ``chunk_counts`` finds
those numbers. ``ring_slip`` reads them:

- every rank's tensor unchanged: the sum never written into the tensor given (not in place);
- every element 1/N of the sum: the result divided by the world size;
- a rank counted twice or more: the all-gather adds where it should overwrite;
- every chunk one rank's values: the reduce-scatter overwrites where it should add (chunk j holds
  rank j's values), or the all-gather spreads chunks the reduce-scatter never summed;
- one chunk per rank a partial sum: the all-gather stops a step short.

``timeout_slip`` names the deadlock behind a send or receive that timed out.

``simulated_problem`` runs the ring first on threads, one per rank (``simulated_group``), where a
deadlock is found the moment every rank waits, not after a timeout, and every message is counted:
a collective instead of send/recv, a send to another rank than the right neighbour, or more
elements than the ring's 2(N - 1) chunks (the whole tensor sent round or to every rank) is named.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from parallel_course.slips.simulated_group import simulate


def _chunks(tensor: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    return tensor.detach().reshape(-1).double().cpu().tensor_split(n)


def chunk_counts(inputs: Sequence[torch.Tensor], results: Sequence[torch.Tensor]) -> list[list[tuple]] | None:
    """Per rank, per chunk: how many times each rank's input makes up that chunk of the rank's result
    (multiples of 1/N). None when some chunk is no such sum, or too short to tell (N elements or fewer)."""
    n = len(inputs)
    if len(results) != n or any(r.numel() != x.numel() for r, x in zip(results, inputs)):
        return None
    pieces = [_chunks(x, n) for x in inputs]
    table = []
    for result in results:
        row = []
        for j, got in enumerate(_chunks(result, n)):
            columns = torch.stack([piece[j] for piece in pieces], dim=1)
            if columns.shape[0] <= n or not torch.isfinite(got).all():
                return None
            counts = torch.linalg.lstsq(columns, got.unsqueeze(1)).solution.squeeze(1)
            counts = torch.round(counts * n) / n
            if not (columns @ counts - got).abs().max().item() <= 1e-4 * (1 + got.abs().max().item()):
                return None
            row.append(tuple(counts.tolist()))
        table.append(row)
    return table


def ring_slip(inputs: Sequence[torch.Tensor], results: Sequence[torch.Tensor]) -> str | None:
    """The slip that the ring's results (rank r's in ``results[r]``, from ``inputs[r]``) point to."""
    if len(inputs) > 1 and all(torch.equal(r.detach().cpu(), x.detach().cpu()) for r, x in zip(results, inputs)):
        return (
            "every rank's tensor still holds its own values: is the sum written into the tensor it was given, "
            "in place (chunks that are views of it)?"
        )
    table = chunk_counts(inputs, results)
    if table is None:
        return None
    n = len(inputs)
    counts = [c for row in table for c in row]
    if all(c == (1 / n,) * n for c in counts):
        return f"every element is 1/{n} of the sum: is the sum divided by the world size? all_reduce sums"
    if any(k >= 2 for c in counts for k in c):
        return (
            "some chunks count a rank's values twice or more: does the all-gather add what it receives, "
            "where it should overwrite?"
        )
    if all(sorted(c) == [0.0] * (n - 1) + [1.0] for c in counts):
        if all(row[j][j] == 1 for row in table for j in range(n)):
            return (
                "every chunk holds the values of one rank, chunk j those of rank j, not the sum: does the "
                "reduce-scatter overwrite what it receives where it should add it?"
            )
        return (
            "every chunk holds the values of one rank, not the sum: the all-gather spreads chunks the "
            "reduce-scatter never summed: does it run N - 1 steps, on the chunks of the plan?"
        )
    partial = [(r, j) for r, row in enumerate(table) for j, c in enumerate(row) if c != (1.0,) * n]
    if sorted(r for r, _ in partial) == list(range(n)) and all(set(c) <= {0.0, 1.0} for c in counts):
        return (
            "on every rank one chunk holds a partial sum and the others the full sum: does the all-gather "
            "run all N - 1 steps?"
        )
    return None


def timeout_slip(error: BaseException) -> str | None:
    """For the error a send or receive raised: the deadlock a timeout points to; None for another error."""
    if "timed out" not in str(error).lower():
        return None
    return (
        "a send or receive timed out: does every rank wait in a blocking send (or recv) for a neighbour that "
        "waits too? See the deadlock rule"
    )


def deadlock_slip(waits: Sequence[str]) -> str:
    """Who waits for whom, when a ring deadlocked: the rule it breaks."""
    if all(" waits in its send " in line for line in waits):
        return (
            "every rank waits in a blocking send for a neighbour that is sending too: see the deadlock rule (even "
            "ranks send first, odd ranks receive first)"
        )
    return "does every rank post as many sends and receives as its neighbours, in an order that lets each match?"


def simulated_problem(ring, world_size: int, numel: int = 1001) -> str | None:
    """The ring run on ``world_size`` threads (a tensor of ``numel`` elements per rank): what is wrong
    with how it communicates, as the end of a FAIL line, or None. An exception it raises is left to
    the real run (None), where its traceback shows."""
    inputs = [(torch.randn(numel, generator=torch.Generator().manual_seed(rank)),) for rank in range(world_size)]
    outcome = simulate(ring, inputs, allowed=("send", "recv"))
    if outcome.forbidden:
        _, name = outcome.forbidden
        return (
            f"ring_allreduce calls dist.{name}: the ring is built from blocking dist.send and dist.recv only, "
            "one chunk to the right neighbour at a time"
        )
    if outcome.deadlock:
        return f"the ring deadlocks ({'; '.join(outcome.deadlock)}): {deadlock_slip(outcome.deadlock)}"
    if outcome.error is not None:
        return None
    most = 2 * (world_size - 1) * -(-numel // world_size)
    for rank in range(world_size):
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        sent = outcome.sent(rank)
        to = sorted({m.dst for m in sent})
        start = []
        if to and to != [right]:
            start.append(f"sends to rank(s) {', '.join(map(str, to))}")
        elements = sum(m.numel for m in sent)
        if elements > most:
            start.append(f"sends {elements:,} elements ({elements / numel:.2f}x the tensor)")
        frm = sorted({m.src for m in outcome.received(rank)})
        if frm and frm != [left]:
            start.append(f"receives from rank(s) {', '.join(map(str, frm))}")
        if start:
            return (
                f"for a tensor of {numel:,} elements rank {rank} {' and '.join(start)}: a ring sends 2(N - 1) chunks "
                f"of about 1/N of it, {most:,} elements at most, to its right neighbour (rank {right}) only, and "
                f"receives from its left (rank {left})"
            )
    return None
