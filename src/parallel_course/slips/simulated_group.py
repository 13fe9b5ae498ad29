"""A process group simulated on threads, in one process: where a lab's code waits, what it sends to
whom, and a deadlock found the moment it happens (labs 03 and 13 point to point, lab 15 collectives).

``simulate(function, inputs)`` runs ``function(*inputs[r])`` on one thread per rank, with
``torch.distributed``'s point-to-point calls (``send``, ``recv``, ``isend``, ``irecv``,
``batch_isend_irecv``, ``P2POp``) and ``get_rank``/``get_world_size`` replaced by the group's own, for
the call only. A send is matched with the receive its peer posts for it (in posting order between
two ranks), as gloo and nccl match them, and the data is copied then. A blocking ``send`` returns
once its receive is posted, a ``recv`` once its data has arrived, a request's ``wait()`` likewise:
so a ring in which every rank sends first waits, as it would between processes. Here nothing times
out: when every rank still running waits for another, the group stops them all and says who waits
for whom (``Outcome.deadlock``), whatever the machine's speed.

It also records every message (sender, receiver, elements), every collective called (``forbidden``:
each raises), and a receive posted into a tensor that a send of the same rank has not yet handed
over (``Outcome.aliased``: on real processes, a race).

Collectives named in ``collectives`` are simulated instead of forbidden, on the whole group or on a
``Subgroup`` of its ranks passed as ``group=`` (``get_rank(group)`` and ``get_world_size(group)``
answer for it): the k-th call of every member of a group is one collective, as gloo and nccl match
them, done when the last member calls it; a member that calls another collective (or another size)
there stops the group (``Outcome.mismatch``), and one that never calls it leaves the others waiting:
a deadlock, named with the members missing. Every collective done is recorded (``Outcome.collectives``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# The collectives a ring built of point-to-point calls should not need: each raises in the group.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "scatter",
    "gather",
    "barrier",
)


# The collectives the group can simulate (``simulate(..., collectives=...)``).
SIMULATED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object", "barrier")


@dataclass(frozen=True)
class Subgroup:
    """Some of the simulated ranks, as ``dist.new_group(ranks)`` would make them: pass it as ``group=``."""

    ranks: tuple[int, ...]
    name: str = ""


class Stopped(BaseException):
    """Raised in a rank's thread when the group stops (a deadlock, or a forbidden call): a
    BaseException, so that the student's ``except Exception`` does not swallow it."""


@dataclass
class Message:
    """One send matched with its receive."""

    src: int
    dst: int
    numel: int
    # The sender's k-th send and the receiver's k-th receive (from 1).
    send_index: int
    recv_index: int


@dataclass
class Collective:
    """One collective, done: what it was, its group's ranks, the elements each member gave, and which
    call of the group it was (from 1)."""

    kind: str
    ranks: tuple[int, ...]
    numel: int
    index: int


@dataclass
class Outcome:
    """What the ranks did. ``deadlock``: who waited for whom when every rank still running waited (None
    if the call ended); ``forbidden``: (rank, name) of the first collective called; ``aliased``: (rank,
    its k-th receive) posted into a tensor its own pending send still holds; ``results``: each rank's
    return value (None where it did not return); ``error``: the first exception a rank raised. Which
    rank first calls a collective depends on the threads' timing: name the call, not the rank.
    ``collectives``: each simulated collective done, in the order they completed; ``mismatch``: what the
    members of a group called as the same collective when they called different ones (None if none)."""

    world_size: int
    messages: list[Message] = field(default_factory=list)
    deadlock: list[str] | None = None
    forbidden: tuple[int, str] | None = None
    aliased: tuple[int, int] | None = None
    results: list = field(default_factory=list)
    error: BaseException | None = None
    # Per rank: sends and receives posted, and whether it returned.
    sends: list[int] = field(default_factory=list)
    receives: list[int] = field(default_factory=list)
    returned: list[bool] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    mismatch: list[str] | None = None
    # Per rank: the simulated collectives it called.
    called: list[int] = field(default_factory=list)

    def sent(self, rank: int) -> list[Message]:
        return [m for m in self.messages if m.src == rank]

    def received(self, rank: int) -> list[Message]:
        return [m for m in self.messages if m.dst == rank]


class _Op:
    """A posted send or receive."""

    def __init__(self, kind: str, rank: int, peer: int, tensor: torch.Tensor, index: int):
        self.kind, self.rank, self.peer, self.tensor, self.index = kind, rank, peer, tensor, index
        self.done = False


class _Request:
    """What isend/irecv return: ``wait()`` blocks until the operation is matched."""

    def __init__(self, group: _Group, op: _Op):
        self.group, self.op = group, op

    def wait(self, timeout=None) -> bool:
        self.group.wait_for(self.op)
        return True

    def is_completed(self) -> bool:
        return self.op.done


class _CollectiveCall:
    """One member's call of a simulated collective: done when every member of its group has called it."""

    def __init__(self, kind, rank: int, ranks: tuple[int, ...], index: int, tensors: dict, detail: tuple, objects):
        self.kind, self.rank, self.ranks, self.index = kind, rank, ranks, index
        # The tensors by their role ("tensor", "list", "input", "output"); all_gather_object's (list, obj).
        self.tensors, self.detail, self.objects = tensors, detail, objects
        self.done = False

    def signature(self) -> tuple:
        """What every member must call alike: the collective, its detail (op, root) and sizes."""
        sizes = tuple(tuple(t.shape) for t in self.tensors.values() if isinstance(t, torch.Tensor))
        return self.kind, self.detail, sizes

    def describe(self) -> str:
        numel = sum(t.numel() for t in self.tensors.values() if isinstance(t, torch.Tensor))
        return f"{self.kind} of {numel} element(s)" if self.tensors else self.kind


_REDUCE = {
    "SUM": lambda x: x.sum(0),
    "AVG": lambda x: x.mean(0) if x.is_floating_point() else x.sum(0) // x.shape[0],
    "MAX": lambda x: x.amax(0),
    "MIN": lambda x: x.amin(0),
    "PRODUCT": lambda x: x.prod(0),
}


def _op_name(op) -> str:
    """SUM, AVG, MAX, ... of a dist.ReduceOp."""
    return str(op).rsplit(".", 1)[-1].split(":")[0].strip("<> ").upper()


class P2POp:
    """dist.P2POp's stand-in: an operation (the group's isend or irecv), a tensor and a peer."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        self.op, self.tensor, self.peer = op, tensor, peer if peer is not None else group_peer


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class _Group:
    def __init__(self, world_size: int):
        self.n = world_size
        self.condition = threading.Condition()
        self.local = threading.local()
        self.pending: dict[tuple[int, int], tuple[deque, deque]] = {}
        self.outcome = Outcome(world_size, sends=[0] * world_size, receives=[0] * world_size)
        self.outcome.returned = [False] * world_size
        self.outcome.results = [None] * world_size
        self.waiting: dict[int, _Op] = {}
        self.finished: set[int] = set()
        self.stopped = False
        # Per rank, the operations it posted and has not waited for yet.
        self.unwaited: dict[int, list[_Op]] = {}
        # What an operation of P2POp is: the group's isend/irecv, or torch's own taken before the call.
        self.kinds: dict = {}
        self.outcome.called = [0] * world_size
        # Simulated collectives: per group (its ranks), the k-th call of each member; and how many
        # calls each member has made on each group.
        self.rounds: dict[tuple[int, ...], dict[int, dict[int, _CollectiveCall]]] = {}
        self.counts: dict[tuple[tuple[int, ...], int], int] = {}
        self.collective_names: tuple[str, ...] = ()

    # -- the calls the student's code makes ---------------------------------------------------

    def members(self, group) -> tuple[int, ...]:
        """The ranks of ``group`` (a Subgroup; None: every rank)."""
        if group is None:
            return tuple(range(self.n))
        if isinstance(group, Subgroup):
            return group.ranks
        raise TypeError(f"group= must be None or one of the simulated group's Subgroups, got {type(group).__name__}")

    def rank(self, group=None) -> int:
        ranks = self.members(group)
        return ranks.index(self.local.rank) if self.local.rank in ranks else -1

    def world_size(self, group=None) -> int:
        return len(self.members(group))

    def group_ranks(self, group) -> list[int]:
        return list(self.members(group))

    def _post(self, kind: str, tensor: torch.Tensor, peer: int) -> _Op:
        rank = self.local.rank
        with self.condition:
            self._check_stopped()
            counts = self.outcome.sends if kind == "send" else self.outcome.receives
            counts[rank] += 1
            op = _Op(kind, rank, peer, tensor, counts[rank])
            # A receive into a tensor this rank still sends, or the reverse: in the order the code
            # posts them, so found whatever the order the ranks run in.
            other = "send" if kind == "recv" else "recv"
            unwaited = self.unwaited.setdefault(rank, [])
            clash = [o for o in unwaited if o.kind == other and _same_storage(tensor, o.tensor)]
            if clash:
                found = (rank, op.index if kind == "recv" else clash[0].index)
                # The first rank to find it depends on the threads' timing: keep the lowest.
                self.outcome.aliased = min(found, self.outcome.aliased or found)
            unwaited.append(op)
            src, dst = (rank, peer) if kind == "send" else (peer, rank)
            sends, receives = self.pending.setdefault((src, dst), (deque(), deque()))
            mine, theirs = (sends, receives) if kind == "send" else (receives, sends)
            if theirs:
                self._match(*((op, theirs.popleft()) if kind == "send" else (theirs.popleft(), op)))
            else:
                mine.append(op)
            return op

    def _match(self, send: _Op, receive: _Op) -> None:
        receive.tensor.copy_(send.tensor)
        send.done = receive.done = True
        self.outcome.messages.append(Message(send.rank, receive.rank, send.tensor.numel(), send.index, receive.index))
        self.condition.notify_all()

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        return _Request(self, self._post("send", tensor, dst if dst is not None else group_dst))

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None):
        return _Request(self, self._post("recv", tensor, src if src is not None else group_src))

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        self.isend(tensor, dst, group, tag, group_dst).wait()

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        self.irecv(tensor, src, group, tag, group_src).wait()
        return src

    def batch_isend_irecv(self, ops):
        return [_Request(self, self._post(self.kinds[op.op], op.tensor, op.peer)) for op in ops]

    # -- simulated collectives ------------------------------------------------------------------

    def _collective(self, kind: str, group, tensors: dict, detail: tuple = (), async_op=False, objects=None):
        """Post this rank's call; wait for the collective unless ``async_op`` (then return its request).
        ``objects``: all_gather_object's (object_list, obj)."""
        rank = self.local.rank
        ranks = self.members(group)
        if rank not in ranks:
            raise ValueError(f"rank {rank} calls {kind} on a group of ranks {list(ranks)}, which it is not in")
        with self.condition:
            self._check_stopped()
            key = (ranks, rank)
            self.counts[key] = index = self.counts.get(key, 0) + 1
            self.outcome.called[rank] += 1
            call = _CollectiveCall(kind, rank, ranks, index, tensors, detail, objects)
            calls = self.rounds.setdefault(ranks, {}).setdefault(index, {})
            calls[rank] = call
            if len(calls) == len(ranks):
                self._complete([calls[r] for r in ranks])
        request = _Request(self, call)
        if async_op:
            return request
        request.wait()
        return None

    def _complete(self, calls: list[_CollectiveCall]) -> None:
        """Every member has called: the same collective, or the group stops; then the data moves."""
        first = calls[0]
        if any(c.signature() != first.signature() for c in calls):
            self.outcome.mismatch = [f"rank {c.rank} calls {c.describe()}" for c in calls]
            self._stop()
            return
        tensors = [c.tensors for c in calls]
        if first.kind == "all_reduce":
            reduced = _REDUCE[first.detail[0]](torch.stack([t["tensor"] for t in tensors]))
            for t in tensors:
                t["tensor"].copy_(reduced)
        elif first.kind == "broadcast":
            source = tensors[first.ranks.index(first.detail[0])]["tensor"].clone()
            for t in tensors:
                t["tensor"].copy_(source)
        elif first.kind == "all_gather":
            for t in tensors:
                for out, member in zip(t["list"], tensors):
                    out.copy_(member["tensor"])
        elif first.kind == "all_gather_into_tensor":
            gathered = torch.cat([member["input"].reshape(-1) for member in tensors])
            for t in tensors:
                t["output"].view(-1).copy_(gathered)
        elif first.kind == "all_gather_object":
            gathered = [c.objects[1] for c in calls]
            for c in calls:
                c.objects[0][:] = gathered
        numel = sum(v.numel() for v in first.tensors.values() if isinstance(v, torch.Tensor))
        self.outcome.collectives.append(Collective(first.kind, first.ranks, numel, first.index))
        for c in calls:
            c.done = True
        self.condition.notify_all()

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        name = _op_name(op)
        if name not in _REDUCE:
            raise ValueError(f"the simulated group cannot reduce with {op}")
        return self._collective("all_reduce", group, {"tensor": tensor}, (name,), async_op)

    def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
        if src is None:
            src = self.members(group)[group_src]
        return self._collective("broadcast", group, {"tensor": tensor}, (src,), async_op)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        if len(tensor_list) != len(self.members(group)):
            raise ValueError(f"all_gather needs one tensor per member of the group, got {len(tensor_list)}")
        return self._collective("all_gather", group, {"tensor": tensor, "list": tensor_list}, (), async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        tensors = {"output": output_tensor, "input": input_tensor}
        return self._collective("all_gather_into_tensor", group, tensors, (), async_op)

    def all_gather_object(self, object_list, obj, group=None):
        return self._collective("all_gather_object", group, {}, (), objects=(object_list, obj))

    def barrier(self, group=None, async_op=False, device_ids=None, timeout=None):
        return self._collective("barrier", group, {}, (), async_op)

    def forbidden(self, name: str):
        def call(*args, **kwargs):
            with self.condition:
                if self.outcome.forbidden is None:
                    self.outcome.forbidden = (self.local.rank, name)
                self._stop()
            raise Stopped

        return call

    # -- waiting, and the deadlock -------------------------------------------------------------

    def _check_stopped(self) -> None:
        if self.stopped:
            raise Stopped

    def _stop(self) -> None:
        self.stopped = True
        self.condition.notify_all()

    def wait_for(self, op: _Op) -> None:
        with self.condition:
            self.waiting[op.rank] = op
            try:
                while not op.done:
                    # (this rank's own wait may complete a deadlock: then it stops here too)
                    self._find_deadlock()
                    self._check_stopped()
                    self.condition.wait()
            finally:
                del self.waiting[op.rank]
            unwaited = self.unwaited.get(op.rank, [])
            if op in unwaited:
                unwaited.remove(op)

    def finish(self, rank: int) -> None:
        with self.condition:
            self.finished.add(rank)
            self._find_deadlock()
            self.condition.notify_all()

    def _find_deadlock(self) -> None:
        """Every rank still running waits, none can be matched any more: say who waits for whom, stop."""
        blocked = {rank: op for rank, op in self.waiting.items() if not op.done}
        if self.stopped or len(blocked) + len(self.finished) < self.n or not blocked:
            return
        lines = []
        for rank in range(self.n):
            if rank in blocked:
                op = blocked[rank]
                if isinstance(op, _CollectiveCall):
                    missing = [r for r in op.ranks if r not in self.rounds[op.ranks][op.index]]
                    lines.append(
                        f"rank {rank} waits in its {op.kind} #{op.index} on ranks {list(op.ranks)}, "
                        f"which rank(s) {missing} never called"
                    )
                    continue
                how = f"in its send #{op.index} to" if op.kind == "send" else f"for its receive #{op.index} from"
                lines.append(f"rank {rank} waits {how} rank {op.peer}")
            elif self.collective_names:
                lines.append(f"rank {rank} returned after {self.outcome.called[rank]} collective call(s)")
            else:
                done = self.outcome.sends[rank]
                lines.append(f"rank {rank} returned after {done} send(s) and {self.outcome.receives[rank]} receive(s)")
        self.outcome.deadlock = lines
        self._stop()


POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def simulate(
    function: Callable,
    inputs: Sequence[Sequence],
    allowed: Sequence[str] = POINT_TO_POINT,
    forbidden: Sequence[str] = COLLECTIVES,
    bound_s: float = 60,
    collectives: Sequence[str] = (),
) -> Outcome:
    """``function(*inputs[r])`` on one thread per rank r of a group of ``len(inputs)``: what they did.
    ``allowed``: the point-to-point calls it may make (the others of POINT_TO_POINT count as forbidden,
    as do ``forbidden``'s). ``collectives``: those of SIMULATED that are simulated, not forbidden.
    ``bound_s`` bounds only code that waits outside the group (a real collective the list misses)."""
    unknown = set(collectives) - set(SIMULATED)
    if unknown:
        raise ValueError(f"the simulated group cannot run {sorted(unknown)}; it simulates {list(SIMULATED)}")
    group = _Group(len(inputs))
    group.collective_names = tuple(collectives)
    own = {
        "send": group.send,
        "recv": group.recv,
        "isend": group.isend,
        "irecv": group.irecv,
        "batch_isend_irecv": group.batch_isend_irecv,
    }
    names = {
        "get_rank": group.rank,
        "get_world_size": group.world_size,
        "get_process_group_ranks": group.group_ranks,
        "P2POp": P2POp,
        **{name: own[name] if name in allowed else group.forbidden(name) for name in POINT_TO_POINT},
        **{name: group.forbidden(name) for name in forbidden if hasattr(dist, name) and name not in collectives},
        **{name: getattr(group, name) for name in collectives},
    }
    saved = {name: getattr(dist, name) for name in names}
    group.kinds = {group.isend: "send", group.irecv: "recv", saved["isend"]: "send", saved["irecv"]: "recv"}
    errors: list[tuple[int, BaseException]] = []

    def run(rank: int) -> None:
        group.local.rank = rank
        try:
            group.outcome.results[rank] = function(*inputs[rank])
            group.outcome.returned[rank] = True
        except Stopped:
            pass
        except BaseException as error:  # noqa: BLE001 (the first one is the outcome's error)
            errors.append((rank, error))
            with group.condition:
                group._stop()
        finally:
            group.finish(rank)

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(group.n)]
    for name, value in names.items():
        setattr(dist, name, value)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(bound_s)
    finally:
        for name, value in saved.items():
            setattr(dist, name, value)
    if errors:
        group.outcome.error = min(errors, key=lambda e: e[0])[1]
    return group.outcome
