"""Lab 04 (the DDP bug hunt): the likely slips, recognised from what the student's fixed script wrote.

- ``writers_slip``: more than one process wrote the checkpoint;
- ``loss_slip``: the logged loss per epoch against the reference's: divided by one batch too few
  (n/(n-1) times it: the last index where the number of batches is meant), summed over the ranks
  (N times it), or rank 0's own loss where the mean over the ranks is wanted, or both of the first
  and the last.

The final weights are compared with what each slip trains (``checks.matching_slip``), named by
``WHOLE_DATA`` (no DistributedSampler: every rank reads the whole data set, the same batches) and
``SAME_ORDER`` (no ``set_epoch``): the runs of those slips are the lab's own reference run with one
switch turned, in the notebook.
"""

from __future__ import annotations

from collections.abc import Sequence

from parallel_course.checks import scale_of

# What the final weights point to when they equal those of a run with one likely mistake.
WHOLE_DATA = (
    "these are the weights of every rank reading the whole data set, the same batches on each: is each "
    "rank given its own share of the data?"
)
SAME_ORDER = "these are the weights of one order in every epoch: is the sampler told the epoch?"
# The logged losses are sums of float32 losses in another order: they agree to about 1e-6.
RTOL = 1e-4


def writers_slip(writers: Sequence[str]) -> str | None:
    """The slip when more than one process wrote the checkpoint (``writers``: "rank r", one per write)."""
    if len(writers) < 2:
        return None
    return f"{len(writers)} writes, by {', '.join(sorted(set(writers)))}: does every rank save the checkpoint?"


def _near(x: float | None, target: float) -> bool:
    return x is not None and abs(x - target) <= 1e-3 * target


def loss_slip(
    logged: Sequence[float], reference: Sequence[float], rank0: Sequence[float], batches: int, world_size: int
) -> str | None:
    """The slip that the logged losses per epoch point to. ``reference``: the mean loss over every rank
    and batch of each epoch; ``rank0``: rank 0's own; ``batches``: batches per epoch on a rank."""
    one_short = batches / (batches - 1) if batches > 1 else None
    short = f"divided by one batch too few ({batches - 1}, the last batch's index, where there are {batches} batches)?"
    scale = scale_of(list(logged), list(reference), rtol=RTOL)
    scale0 = scale_of(list(logged), list(rank0), rtol=RTOL)
    if _near(scale0, 1) and world_size > 1:
        return "these are rank 0's own losses: is the loss averaged over the ranks before it is logged?"
    if one_short and _near(scale0, one_short) and world_size > 1:
        return f"these are rank 0's own losses, {scale0:.4f}x: averaged over the ranks, and " + short
    if one_short and _near(scale, one_short):
        return f"every epoch's loss is {scale:.4f}x the reference's: " + short
    if _near(scale, world_size) and world_size > 1:
        return (
            f"every epoch's loss is {scale:.2f}x the reference's: is the sum over the ranks divided by the world size?"
        )
    return None
