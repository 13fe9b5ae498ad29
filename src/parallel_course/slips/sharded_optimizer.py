"""Lab 08 (a sharded optimizer, ZeRO stage 1): the likely slips, recognised from what the
student's optimizer produced on every rank.

- ``balance_slip``: owners assigned round-robin by position, or all to one rank;
- ``state_slip``: optimizer state for every parameter on every rank (the whole model stepped), or
  for the parameters a rank does not own;
- ``weights_slip``: what the weights after training say, parameter by parameter and rank by rank
  (each compared with the reference, the initial weights and a reference whose learning rate never
  changed): nothing moved, only each rank's own parameters moved (no broadcast), one rank's
  parameters never moved (broadcast from the wrong rank), the learning-rate change lost.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# What a parameter's final weights equal, on one rank (``weights_slip``).
REFERENCE, INITIAL, LR_UNCHANGED, OTHER = "reference", "initial", "learning rate unchanged", "other"


def weight_status(
    final: Sequence[torch.Tensor],
    reference: Sequence[torch.Tensor],
    initial: Sequence[torch.Tensor],
    lr_unchanged: Sequence[torch.Tensor],
    atol: float,
) -> list[str]:
    """Per parameter, what its ``final`` weights equal (within ``atol``): the reference's, the
    initial ones (exactly), those of a reference whose learning rate never changed, or none."""

    def close(a, b):
        return a.shape == b.shape and (a.detach() - b.detach()).abs().max().item() <= atol

    found = []
    for p, ref, init, unchanged in zip(final, reference, initial, lr_unchanged):
        if close(p, ref):
            found.append(REFERENCE)
        elif torch.equal(p.detach(), init.detach()):
            found.append(INITIAL)
        else:
            found.append(LR_UNCHANGED if close(p, unchanged) else OTHER)
    return found


def balance_slip(owners: Sequence[int], numels: Sequence[int], world_size: int) -> str | None:
    """The slip that ``owners`` (each parameter's owner rank, in the model's order) point to, for
    parameters of ``numels`` elements, or None."""
    if len(set(owners)) == 1 and world_size > 1:
        return f"every parameter is owned by rank {owners[0]}"
    if list(owners) == [i % world_size for i in range(len(owners))] and len(set(numels)) > 1:
        return (
            "the owners go round-robin by position (parameter i to rank i % N): it ignores the sizes, and "
            "here puts the big matrices together on one rank"
        )
    return None


def state_slip(held: Sequence[Sequence[int]], owners: Sequence[int] | None, n_params: int) -> str | None:
    """The slip that ``held`` (per rank, the indices of the parameters it holds optimizer state for)
    points to, given each parameter's owner (None if unknown), or None."""
    everything = list(range(n_params))
    world_size = len(held)
    if world_size > 1 and all(sorted(h) == everything for h in held):
        return (
            "every rank holds optimizer state for every parameter: the wrapped optimizer steps the whole "
            "model where it should get only this rank's parameters"
        )
    if owners is not None and world_size > 1:
        others = [sorted(i for i in everything if owners[i] != rank) for rank in range(world_size)]
        if [sorted(h) for h in held] == others:
            return "each rank holds state for the parameters it does not own, and none for those it owns"
    return None


def weights_slip(status: Sequence[Sequence[str]], owners: Sequence[int] | None) -> str | None:
    """The slip that ``status`` (per rank, per parameter: REFERENCE, INITIAL, LR_UNCHANGED or OTHER,
    what its final weights equal) points to, given each parameter's owner (None if unknown)."""
    flat = [s for per_rank in status for s in per_rank]
    if all(s == REFERENCE for s in flat):
        return None
    if all(s == INITIAL for s in flat):
        return "no parameter moved on any rank: does step() step the parameters this rank owns?"
    if all(s == LR_UNCHANGED for s in flat):
        return (
            "the weights are those of a run whose learning rate was never halved: does the change made "
            "in self.param_groups reach the wrapped optimizer before it steps?"
        )
    if owners is None or len(owners) != len(status[0]):
        return None
    # A rank's own parameters moved (wherever to: the others' stale weights change its gradients),
    # the others kept their initial values.
    if len(status) > 1 and all(
        (s != INITIAL) == (owners[i] == rank) for rank, row in enumerate(status) for i, s in enumerate(row)
    ):
        return (
            "on each rank only the parameters it owns moved, the others kept their initial values: after "
            "the step, every parameter must reach the other ranks from its owner"
        )
    stuck = {i for i in range(len(owners)) if all(row[i] == INITIAL for row in status)}
    stuck_owners = {owners[i] for i in stuck}
    if stuck and stuck == {i for i in range(len(owners)) if owners[i] in stuck_owners}:
        ranks = ", ".join(map(str, sorted(stuck_owners)))
        return (
            f"the parameters owned by rank {ranks} never moved, on any rank, and the others did: is every "
            "parameter broadcast from its own owner?"
        )
    return None
