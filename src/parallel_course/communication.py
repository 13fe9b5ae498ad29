"""Talking less (14c): what data parallelism puts on the wire, counted and predicted.

- ``CollectiveCounter``: while open, records every ``all_reduce``, ``all_gather_single`` and
  ``reduce_scatter_single`` that goes through ``torch.distributed`` (DDP's communication hooks,
  PowerSGD and FSDP2 call them there): the operation, its group, dtype and bytes. On torch 2.11
  and 2.12 the last two are ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (what FSDP2
  calls there): the counter wraps whichever names the running torch has (``compat``).
- Expected bytes: a DDP bucket sent whole, in 16 bits, or as PowerSGD's factors; what a ring
  sends per rank for each collective; HSDP's and FSDP's collectives per step; the bytes that cross
  between nodes, each rank's sends counted on the ring edge that carries them (``bytes_by_link``),
  and their closed forms per node.
- Local SGD / DiLoCo's outer step written by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel_course import compat

COUNTED = ("all_reduce", "all_gather_single", "reduce_scatter_single")


@dataclass(frozen=True)
class Call:
    """One collective as this rank called it: the payload is the tensor it handed in."""

    op: str
    group_size: int
    ranks: tuple[int, ...]
    dtype: torch.dtype
    payload_bytes: int

    @property
    def sent_bytes(self) -> int:
        """What this rank sends with the ring algorithm (chapter 03)."""
        return ring_bytes_sent(self.op, self.payload_bytes, self.group_size)


def ring_bytes_sent(op: str, payload_bytes: int, group_size: int) -> int:
    """Bytes one rank sends in a ring collective over group_size ranks, given what it hands in.

    all_reduce of S bytes: 2 (N - 1) / N * S (reduce-scatter, then all-gather);
    all_gather_single of a shard of S bytes: (N - 1) * S;
    reduce_scatter_single of S bytes: (N - 1) / N * S
    (Patarasuk and Yuan 2009; NCCL's performance notes, "algorithm bandwidth" vs "bus bandwidth").
    """
    n = group_size
    if op == "all_reduce":
        return 2 * (n - 1) * payload_bytes // n
    if op == "all_gather_single":
        return (n - 1) * payload_bytes
    if op == "reduce_scatter_single":
        return (n - 1) * payload_bytes // n
    raise ValueError(f"unknown collective {op!r}; expected one of {COUNTED}")


class CollectiveCounter:
    """Record the collectives called through ``torch.distributed`` while open.

    Wraps ``dist.all_reduce`` and every name the running torch has for the single-tensor
    all-gather and reduce-scatter (``all_gather_single`` or, before torch 2.13,
    ``all_gather_into_tensor``; the same for the reduce-scatter), records each under the names of
    ``COUNTED``, and puts them back on exit. PowerSGD starts later all-reduces from a future's
    callback, on another thread, so the list is guarded by a lock; read it after the step has
    finished.
    """

    def __init__(self):
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def _record(self, op: str, tensor: torch.Tensor, group) -> None:
        ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
        call = Call(op, len(ranks), ranks, tensor.dtype, tensor.numel() * tensor.element_size())
        with self._lock:
            self.calls.append(call)

    def _counted(self, canonical: str, original):
        # The same parameters as torch's functions, so that callers may pass any of them by name.
        if canonical == "all_reduce":

            def counted(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
                self._record("all_reduce", tensor, group)
                return original(tensor, op=op, group=group, async_op=async_op)

        elif canonical == "all_gather_single":

            def counted(output_tensor, input_tensor, group=None, async_op=False):
                self._record("all_gather_single", input_tensor, group)
                return original(output_tensor, input_tensor, group=group, async_op=async_op)

        else:

            def counted(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
                self._record("reduce_scatter_single", input, group)
                return original(output=output, input=input, op=op, group=group, async_op=async_op)

        return counted

    def __enter__(self) -> CollectiveCounter:
        names = {"all_reduce": ("all_reduce",)}
        names.update({canonical: compat.present_names(canonical) for canonical in COUNTED[1:]})
        self._originals = {name: getattr(dist, name) for canonical in COUNTED for name in names[canonical]}
        for canonical in COUNTED:
            for name in names[canonical]:
                setattr(dist, name, self._counted(canonical, self._originals[name]))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)

    def clear(self) -> list[Call]:
        """The calls recorded so far, and start again from none."""
        with self._lock:
            calls, self.calls = self.calls, []
        return calls


def totals(calls: Iterable[Call]) -> dict[str, int]:
    """Calls, payload bytes and ring bytes sent, summed."""
    calls = list(calls)
    return {
        "calls": len(calls),
        "payload_bytes": sum(c.payload_bytes for c in calls),
        "sent_bytes": sum(c.sent_bytes for c in calls),
    }


# DDP communication hooks: what one bucket puts on the wire.


def bucket_bytes(shapes: Iterable[tuple[int, ...]], element_size: int = 4) -> int:
    """Bytes of a bucket of gradients of these shapes, all-reduced whole (DDP's default hook)."""
    return sum(torch.Size(s).numel() for s in shapes) * element_size


def fp16_bytes(shapes: Iterable[tuple[int, ...]]) -> int:
    """``fp16_compress_hook``: the same bucket cast to 16 bits, 2 bytes an element."""
    return bucket_bytes(shapes, element_size=2)


def powersgd_compressed(n: int, m: int, rank: int, min_compression_rate: float = 2) -> bool:
    """Whether PowerSGD compresses an n x m gradient: (n + m) r * min_compression_rate < n m
    (``powerSGD_hook._should_compress``), r = min(n, m, rank)."""
    r = min(n, m, rank)
    return (n + m) * r * min_compression_rate < n * m


def powersgd_elements(shapes: Iterable[tuple[int, ...]], rank: int, min_compression_rate: float = 2) -> dict:
    """Elements PowerSGD all-reduces for one bucket after its warm-up, in three all-reduces.

    Every gradient is viewed as a matrix n x m (n = its first dimension, m = the rest; a vector
    is n x 1). One worth compressing sends P (n x r) and Q (m x r) instead of its n m elements
    (Vogels et al. 2019, "PowerSGD", Algorithm 1); the others are sent whole, in one flat tensor.
    """
    uncompressed = p = q = 0
    for shape in shapes:
        n = shape[0] if len(shape) else 1
        m = torch.Size(shape).numel() // n
        if powersgd_compressed(n, m, rank, min_compression_rate):
            r = min(n, m, rank)
            p += n * r
            q += m * r
        else:
            uncompressed += n * m
    return {"uncompressed": uncompressed, "P": p, "Q": q}


def powersgd_step_bytes(
    shapes: Iterable[tuple[int, ...]], rank: int, step: int, start_iter: int, element_size: int = 4
) -> int:
    """Payload bytes of one bucket at training step ``step`` (1-based): the whole bucket while
    ``step <= start_iter`` (PowerSGD's warm-up runs the plain all-reduce), then P, Q and the
    uncompressed gradients."""
    shapes = list(shapes)
    if step <= start_iter:
        return bucket_bytes(shapes, element_size)
    return sum(powersgd_elements(shapes, rank).values()) * element_size


# HSDP and FSDP: collectives per step; bytes across nodes.


def mesh_groups(rank: int, replicate: int, shard: int) -> dict[str, tuple[int, ...]]:
    """The global ranks of ``rank``'s two groups on a (replicate, shard) mesh laid out as
    ``init_device_mesh`` lays it out (row-major: rank = i * shard + j): "shard", the ``shard``
    consecutive ranks of its row (a node, when a node holds ``shard`` ranks); "replicate", the
    ranks of its column, one per row."""
    i, j = divmod(rank, shard)
    return {
        "shard": tuple(i * shard + k for k in range(shard)),
        "replicate": tuple(k * shard + j for k in range(replicate)),
    }


def sharded_step_calls(
    group_elements: Iterable[int],
    replicate: int,
    shard: int,
    regathered: Iterable[bool],
    element_size: int = 4,
    rank: int = 0,
) -> list[dict]:
    """The collectives ``rank`` calls in one training step of FSDP2 on a (replicate, shard) mesh.

    group_elements: the parameter elements of each ``fully_shard`` group, each divisible by shard
    (no padding). For each group: an all-gather of its shard in forward, and again in backward when
    it was resharded after forward (regathered; FSDP2 keeps the root's parameters through
    backward); a reduce-scatter of its whole gradient over the shard dimension; when replicate > 1,
    an all-reduce of the gradient's shard over the replicate dimension (HSDP). With replicate 1
    this is FSDP over ``shard`` ranks (Zhao et al. 2023, "PyTorch FSDP", on hybrid sharding).
    Each call names its group's global ranks (``mesh_groups``).
    """
    groups = mesh_groups(rank, replicate, shard)
    over_shard = {"group_size": shard, "ranks": groups["shard"]}
    over_replicate = {"group_size": replicate, "ranks": groups["replicate"]}
    calls = []
    for elements, again in zip(group_elements, regathered, strict=True):
        shard_bytes = elements // shard * element_size
        for _ in range(2 if again else 1):
            calls.append({"op": "all_gather_single", **over_shard, "payload_bytes": shard_bytes})
        calls.append({"op": "reduce_scatter_single", **over_shard, "payload_bytes": elements * element_size})
        if replicate > 1:
            calls.append({"op": "all_reduce", **over_replicate, "payload_bytes": shard_bytes})
    return calls


def ring_next(rank: int, ranks: Iterable[int]) -> int:
    """The rank that ``rank`` sends to in a ring over its group: the group's next rank in order,
    the last one sending to the first."""
    ordered = sorted(ranks)
    return ordered[(ordered.index(rank) + 1) % len(ordered)]


def _sent_and_ranks(call) -> tuple[int, tuple[int, ...]]:
    if isinstance(call, Call):
        return call.sent_bytes, call.ranks
    return ring_bytes_sent(call["op"], call["payload_bytes"], call["group_size"]), tuple(call["ranks"])


def bytes_by_link(calls_by_rank: Mapping[int, Iterable], ranks_per_node: int) -> dict[str, int]:
    """Ring bytes the ranks given send, summed, split by the link each rank sends them on.

    In a ring collective a rank sends all it sends to one neighbour: the next rank of the group's
    ring (``ring_next``, the group's ranks in order, so that a node's ranks are neighbours, as in
    NCCL's rings). Its bytes are "inter-node" when that neighbour is on another node (a node holds
    ``ranks_per_node`` consecutive global ranks), else "intra-node". A group that spans nodes sends
    across them only on the ring's edges that leave a node: in a ring of 4 ranks over 2 nodes, 2
    of its 4 edges. calls_by_rank: each rank's calls (``Call`` records, or ``sharded_step_calls``'
    dicts). Every rank of the job given: the inter-node bytes are what all the nodes send to each
    other, the bytes that cross node boundaries.
    """
    out = {"intra-node": 0, "inter-node": 0}
    for rank, calls in calls_by_rank.items():
        for call in calls:
            sent, ranks = _sent_and_ranks(call)
            same_node = ring_next(rank, ranks) // ranks_per_node == rank // ranks_per_node
            out["intra-node" if same_node else "inter-node"] += sent
    return out


def cross_node_bytes_per_node(layout: str, gradient_bytes: int, nodes: int, ranks_per_node: int) -> float:
    """Bytes leaving each node per step, in the model of ``bytes_by_link``, for G gradient bytes
    (as many as the parameters' bytes), N = nodes x ranks_per_node ranks, r = nodes:

    - "ddp": one all-reduce over all N ranks; one edge of the ring leaves each node, carrying
      what one rank sends: 2 (N - 1) / N x G.
    - "fsdp": over all N ranks, two all-gathers (every group regathered for backward) and one
      reduce-scatter on that edge: 3 (N - 1) / N x G.
    - "hsdp": shard inside the node, replicate across: each of the node's ranks all-reduces its
      shard G / s over the r nodes in a ring whose every edge crosses: 2 (r - 1) / r x G per node.
      As nodes are added it tends to 2 G, as DDP's does: HSDP saves FSDP's all-gathers and
      reduce-scatters on the network, not the gradients' all-reduce.
    """
    n, r = nodes * ranks_per_node, nodes
    factor = {"ddp": 2 * (n - 1) / n, "fsdp": 3 * (n - 1) / n, "hsdp": 2 * (r - 1) / r}[layout]
    return factor * gradient_bytes


def describe_leaving(
    nodes: list[int], leaving: dict[str, list[float]], labels: dict[str, str], ranks_per_node: int
) -> str:
    """The text alternative of chapter 14c's lines of ``cross_node_bytes_per_node``: for each
    layout, the bytes leaving a node per step, in gradients, at each number of nodes."""
    lines = "; ".join(
        f"{labels[k]}: " + ", ".join(f"{g:.2f} at {r}" for r, g in zip(nodes, leaving[k], strict=True)) for k in labels
    )
    return (
        f"Bytes leaving a node per step, in units of the gradient's bytes, against {nodes[0]} to {nodes[-1]} "
        f"nodes of {ranks_per_node} GPUs (log scale), a line per layout. {lines}."
    )


# Local SGD / DiLoCo: the outer step by hand.


@torch.no_grad()
def outer_step(model: torch.nn.Module, anchor: list[torch.Tensor], optimizer: torch.optim.Optimizer, group=None):
    """DiLoCo's outer step (Douillard et al. 2023, Algorithm 1), every H inner steps.

    anchor: the weights at the last synchronisation, the outer optimizer's parameters. The
    pseudo-gradient anchor - current weights, averaged over the ranks with one all-reduce (all
    parameters in one flat tensor), is the anchor's gradient; the outer optimizer steps, and
    every rank starts its next inner steps from the new anchor.
    """
    flat = torch.cat([(a - p).reshape(-1) for a, p in zip(anchor, model.parameters())])
    # The only communication of an outer step: every parameter, once.
    dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=group)
    for a, g in zip(anchor, flat.split([a.numel() for a in anchor])):
        a.grad = g.view_as(a).clone()
    optimizer.step()
    for a, p in zip(anchor, model.parameters()):
        p.copy_(a)


class OuterStep:
    """``outer_step`` with its state: the anchor (a copy of the weights now) and the outer
    optimizer over it. DiLoCo's is SGD with Nesterov momentum, learning rate 0.7 and momentum
    0.9, over AdamW inner steps (Douillard et al. 2023, arXiv:2311.08105); with plain SGD of learning
    rate 1 and no momentum the outer step is the average of the ranks' weights: local SGD
    (Stich 2019; Lin et al. 2020)."""

    def __init__(self, model, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True, group=None):
        self.model, self.group = model, group
        self.anchor = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        self.optimizer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)

    def step(self) -> None:
        outer_step(self.model, self.anchor, self.optimizer, self.group)


def local_sgd_sync_bytes(param_elements: int, steps: int, h: int, element_size: int = 4) -> dict[str, float]:
    """All-reduces and payload bytes per inner step when the weights are averaged every h steps
    (one all-reduce of every parameter per outer step); steps must be a multiple of h."""
    if steps % h:
        raise ValueError(f"steps ({steps}) must be a multiple of H ({h})")
    syncs = steps // h
    return {"all_reduces": syncs, "per_step_bytes": syncs * param_elements * element_size / steps}


def describe_local_sgd(runs: Mapping[str, dict], steps: int, window: int = 8) -> str:
    """The text alternative of chapter 14c's local SGD figure: per run, its training loss (the mean
    of ``window`` inner steps) at the first and last window, and its held-out loss against the bytes
    it all-reduced per step."""
    parts = []
    for name, run in runs.items():
        losses = run["losses"]
        first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
        parts.append(
            f"{name}: training loss {first:.3f} at step {window}, {last:.3f} at step {steps}; held-out loss "
            f"{run['held_out']:.4f} at {run['payload_bytes'] / steps:,.0f} bytes per step"
        )
    return (
        f"Left: training loss, the mean of {window} inner steps, per step; right: held-out loss against the bytes "
        "all-reduced per step (log scale), a dot per run. " + "; ".join(parts) + "."
    )
