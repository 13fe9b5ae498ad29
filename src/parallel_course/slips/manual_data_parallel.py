"""Lab 02 (a data-parallel step by hand, the loss on each replica): the likely slips, recognised
from what the student's functions produced.

- ``unwritten_slots``: losses missing from their slots (every thread ran the last replica: a
  function made in a loop sees the loop variable's last value; or threads not joined);
- ``no_gradient_slip``: a replica without gradients (the model run in its place, or no backward);
- ``thread_slip``: the forwards or the backwards run on the calling thread, not on the replicas';
- ``one_at_a_time_slip``: the replicas' threads run one after the other (each joined before the
  next starts), not at the same time;
- ``scale_slip``: a loss or gradient off by the number of samples or of samples per chunk (a sum
  over samples where the mean is wanted, or a division by the number of chunks).

The value-based slips (the plain mean of the chunks' losses or gradients, their sum) are named by
the check cells themselves, through ``checks.matching_slip``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from parallel_course.checks import scale_of


def unwritten_slots(losses) -> str | None:
    """Why some of ``losses`` (one slot per replica) hold None, or None when every slot is written."""
    if not isinstance(losses, (list, tuple)):
        return None
    missing = [i for i, loss in enumerate(losses) if loss is None]
    if not missing:
        return None
    if len(losses) > 1 and missing == list(range(len(losses) - 1)):
        return (
            f"only the last slot ({len(losses) - 1}) was written: did every thread run the last replica "
            "(a function made in a loop sees the loop variable's last value when it runs)?"
        )
    return f"slots {missing} hold None: did every thread write its slot, and were all joined before returning?"


def no_gradient_slip(replica: nn.Module, model: nn.Module) -> str | None:
    """Why ``replica`` has no gradient, when it has none; None when it has one."""
    if all(p.grad is not None for p in replica.parameters()):
        return None
    if any(p.grad is not None for p in model.parameters()):
        return "the replica has no gradient and the model has one: does the thread run the model, not its replica?"
    return "the replica has no gradient: does each thread run the backward of its replica's loss?"


def thread_slip(forward_threads: int, backward_threads: int, n_replicas: int) -> str | None:
    """What the number of threads (other than the caller) that ran a forward and a backward says."""
    if forward_threads == 0 and backward_threads == 0:
        return "every replica ran on the calling thread: does the function start a thread per replica?"
    if forward_threads == n_replicas and backward_threads == 0:
        return (
            "the forwards ran on the replicas' threads and the backwards on the calling thread: "
            "does loss.backward() run after the threads are joined?"
        )
    return None


def scale_slip(got, expected, sizes: Sequence[int]) -> str | None:
    """When ``got`` is ``expected`` times the number of samples, or of samples per chunk: which slip
    that is. ``sizes``: the number of samples in each chunk. None for any other result."""
    scale = scale_of(got, expected)
    total, chunks = sum(sizes), len(sizes)
    if scale is None:
        return None
    if abs(scale - total) <= 1e-3 * total:
        return (
            f"that is {scale:.2f}x the expected, the number of samples: a sum over the samples where "
            "the mean is wanted?"
        )
    if abs(scale - total / chunks) <= 1e-3 * total:
        return (
            f"that is {scale:.2f}x the expected, {total}/{chunks}: divided by the number of chunks "
            "where the number of samples belongs?"
        )
    return None


def one_at_a_time_slip(together: Sequence[bool]) -> str | None:
    """What ``together`` says (per forward: whether every replica's forward had started while it
    waited, a bounded wait): the replicas ran one at a time, or None."""
    if together and not any(together):
        return (
            "the replicas ran one at a time: does the function join each thread before it starts the next? "
            "Start every thread, then join them all"
        )
    return None
