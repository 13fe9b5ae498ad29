"""What a computation in this process uses, measured in a notebook's kernel (chapters 06a, 06c):
the threads that computed, and the bytes autograd keeps for ``backward()``."""

from __future__ import annotations

import os


def _cpu_ticks() -> dict[str, int]:
    """CPU time (user + system, in clock ticks) of each of this process's threads, from /proc."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            # the thread ended meanwhile
            continue
        # utime + stime
        ticks[tid] = int(fields[11]) + int(fields[12])
    return ticks


def threads_that_computed(fn, share: float = 0.25) -> int | None:
    """How many of this process's threads used CPU time while ``fn()`` ran (Linux only).

    Reads each thread's CPU time from ``/proc/self/task`` before and after; a thread counts if it
    used at least ``share`` of the busiest thread's time (a kernel's idle helper threads use next
    to none). ``fn`` should run for a few tenths of a second: the counters tick every 10 ms.
    Returns None where ``/proc`` is not available (macOS, Windows).
    """
    if not os.path.isdir("/proc/self/task"):
        return None
    before = _cpu_ticks()
    fn()
    after = _cpu_ticks()
    used = [after[t] - before.get(t, 0) for t in after]
    busiest = max(used, default=0)
    return sum(u >= share * busiest for u in used) if busiest else 0


_CASTS_AND_VIEWS = {
    "ToCopyBackward0",
    "TBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "ViewBackward0",
    "UnsafeViewBackward0",
    "ExpandBackward0",
    "AliasBackward0",
}
SAVED_KINDS = ("activations", "copies of parameters", "parameters and inputs")


def _is_parameter_copy(tensor, parameter_ids: set[int]) -> bool:
    """Whether ``tensor`` was made from a parameter by casts and views only (e.g. autocast's 16-bit weights)."""
    fn = tensor.grad_fn
    while fn is not None:
        if fn.name() == "torch::autograd::AccumulateGrad":
            return id(fn.variable) in parameter_ids
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if fn.name() not in _CASTS_AND_VIEWS or len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


def saved_for_backward(loss_fn, parameters, inputs=()) -> dict[str, int]:
    """Bytes of the tensors autograd keeps for ``backward()`` while ``loss_fn()`` runs, by kind.

    Each storage counts once. Kinds (``SAVED_KINDS``):

    - ``"parameters and inputs"``: the parameters and the given input tensors themselves, saved
      by reference: they are in memory anyway, so keeping them costs nothing;
    - ``"copies of parameters"``: tensors made from a parameter by casts and views only, such as
      the 16-bit weights ``torch.autocast`` makes: new memory, kept until ``backward()``;
    - ``"activations"``: everything else, what the forward pass computed (including a 16-bit
      copy of the input).

    Calls ``backward()`` on the loss at the end, so that the graph is freed.
    """
    import torch

    parameters = list(parameters)
    parameter_ids = {id(p) for p in parameters}
    existing = {t.untyped_storage().data_ptr() for t in [*parameters, *inputs]}
    kinds: dict[int, tuple[str, int]] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in kinds:
            if storage.data_ptr() in existing:
                kind = "parameters and inputs"
            elif _is_parameter_copy(tensor, parameter_ids):
                kind = "copies of parameters"
            else:
                kind = "activations"
            kinds[storage.data_ptr()] = (kind, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = loss_fn()
    loss.backward()
    totals = dict.fromkeys(SAVED_KINDS, 0)
    for kind, nbytes in kinds.values():
        totals[kind] += nbytes
    return totals
