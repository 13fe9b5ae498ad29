"""Expert parallelism for the capstone's mixture of experts (chapter 13b): each rank of an ep group
keeps its share of every block's experts; two differentiable all-to-alls carry the tokens' slots to
their experts and the outputs back (``dispatch``, ``combine``, hooked on the experts by
``apply_ep``); the gradients are averaged by hand (``reduce_expert_gradients``); ``ExpertLoad``
keeps a step's load-balancing loss and the choices routed to and dropped by each expert. The
gradient's norm, experts included, is ``gradient_norm``'s, as in every layout.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..context_parallel import AllToAll
from ..gpt import GPT, MoE


def dispatch(experts, args, group):
    """Before the experts: every rank's (E, capacity, d) slots become this rank's experts' slots from
    every rank, (E/R, R x capacity, d). Rank j receives the slots of its experts, padding included."""
    size = dist.get_world_size(group)
    slots = AllToAll.apply(args[0], group)
    n_experts, capacity, d = slots.shape
    # Received: R blocks (one per sender) of E/R experts; each expert's slots from all senders together.
    mine = slots.view(size, n_experts // size, capacity, d).transpose(0, 1)
    return (mine.reshape(n_experts // size, size * capacity, d),)


def combine(experts, args, out, group):
    """After the experts: their outputs go back to the ranks whose tokens they are, (E, capacity, d)."""
    size = dist.get_world_size(group)
    local, slots, d = out.shape
    back = out.view(local, size, slots // size, d).transpose(0, 1).reshape(local * size, slots // size, d)
    return AllToAll.apply(back, group)


def apply_ep(model: GPT, ep_mesh: DeviceMesh, data_group) -> None:
    """Expert parallelism: rank r of an ep group of R keeps experts r E/R to (r+1) E/R - 1 of every
    block (the others become Identity, so that names stay as in one process). Each rank routes its
    own tokens into (E, capacity, d) slots as one process would; an all-to-all sends every expert's
    slots to its rank (dispatch), another brings the outputs back (combine). The routers count the
    load over data_group, every rank that trains on a share of the batch."""
    rank, size, group = ep_mesh.get_local_rank(), ep_mesh.size(), ep_mesh.get_group()
    for block in model.blocks:
        moe, per_rank = block.mlp, len(block.mlp.experts) // size
        moe.experts.local = list(range(rank * per_rank, (rank + 1) * per_rank))
        for e in range(len(moe.experts)):
            if e not in moe.experts.local:
                moe.experts[e] = torch.nn.Identity()
        moe.group = data_group
        moe.experts.register_forward_pre_hook(functools.partial(dispatch, group=group))
        moe.experts.register_forward_hook(functools.partial(combine, group=group))


def reduce_expert_gradients(model: GPT, dp_group, expert_dp_group) -> None:
    """ep, dp_ep: the gradients averaged by hand after backward (the loss is scaled as for DDP).
    The dense weights' are summed over every rank; an expert's already holds its whole ep group's
    tokens (the all-to-all's backward brought them) and is summed over its replicas only. Both are
    divided by the world size: DDP's average. One all-reduce per group, over flattened gradients."""
    world_size = dist.get_world_size()
    dense = [p.grad for n, p in model.named_parameters() if ".experts." not in n and p.grad is not None]
    experts = [p.grad for n, p in model.named_parameters() if ".experts." in n and p.grad is not None]
    for grads, group in ((dense, dp_group), (experts, expert_dp_group)):
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=group)
        for g, part in zip(grads, flat.div_(world_size).split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


class ExpertLoad:
    """A mixture of experts' bookkeeping in one step. After each forward: the load-balancing loss to
    add to the training loss (aux_loss_weight times its mean over the layers, per micro-batch,
    scaled by the dp size as the language-model loss is), and the choices routed to and dropped by
    each expert, summed over the micro-batches (each layer counts the tokens of every data rank).
    The statistics are a micro-batch's, over every data rank: with several micro-batches, one process
    and ep group the rows into micro-batches differently, and their auxiliary losses differ a little."""

    def __init__(self, model: GPT, aux_loss_weight: float, micro_batches: int, dp_group):
        self.model = model
        self.layers = [m for m in model.modules() if isinstance(m, MoE)]
        self.weight = aux_loss_weight * dist.get_world_size(dp_group) / micro_batches
        self.dp_group, self.micro_batches = dp_group, micro_batches
        self.aux, self.routed, self.dropped = 0.0, 0, 0

    def after_forward(self) -> torch.Tensor:
        share = sum(m.aux_loss for m in self.layers) / len(self.layers)
        self.aux += share.detach()
        self.routed = self.routed + torch.stack([m.routed for m in self.layers])
        self.dropped = self.dropped + torch.stack([m.dropped for m in self.layers])
        return share * self.weight

    def __str__(self) -> str:
        """What the step's log line adds, once step() has run."""
        return f", aux loss {self.aux_loss:.4f}"

    def step(self, experts: DeviceMesh | None = None) -> dict:
        """After backward: in ep and dp_ep (experts: the expert mesh) the gradients reduced by hand
        first (reduce_expert_gradients). Returns the step's auxiliary loss (this rank's shares summed
        over the ranks, averaged over the micro-batches) and, per layer and expert, the routed and
        dropped choices."""
        if experts is not None:
            reduce_expert_gradients(self.model, self.dp_group, experts.get_group("expert_dp"))
        dist.all_reduce(self.aux, group=self.dp_group)
        self.aux_loss = self.aux.item() / self.micro_batches
        return {"aux_loss": self.aux_loss, "routed": self.routed.tolist(), "dropped": self.dropped.tolist()}
