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

The two mistakes a CPU cannot show are read in the script's syntax tree, whatever its spelling:
``device_from_global_rank`` (a device built from the global rank: ``RANK``, ``dist.get_rank()`` or a
name assigned from them) and ``moved_after_wrap`` (``.to()``/``.cuda()`` of the model, or of its
wrapper, once ``DDP(...)`` has wrapped it).
"""

from __future__ import annotations

import ast
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


def _is_global_rank(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` reads the global rank: RANK from the environment, get_rank(), or a name holding it."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in tainted:
            return True
        if isinstance(sub, ast.Constant) and sub.value == "RANK":
            return True
        if isinstance(sub, ast.Call):
            name = sub.func.attr if isinstance(sub.func, ast.Attribute) else getattr(sub.func, "id", "")
            if name == "get_rank":
                return True
    return False


def _rank_names(tree: ast.AST) -> set[str]:
    """The names assigned (directly or through another such name) from the global rank."""
    tainted: set[str] = set()
    while True:
        more = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and _is_global_rank(node.value, tainted)
        }
        if more <= tainted:
            return tainted
        tainted |= more


def device_from_global_rank(source: str) -> str | None:
    """The first line of ``source`` that picks a device from the global rank, named as a slip; None when
    none does (or the script does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    tainted = _rank_names(tree)
    lines = source.splitlines()
    for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("device", "set_device", "to", "cuda") and any(
            _is_global_rank(arg, tainted) for arg in [*node.args, *(k.value for k in node.keywords)]
        ):
            return (
                f"line {node.lineno} picks a device from the global rank ({lines[node.lineno - 1].strip()}): on the "
                "second node cuda:RANK does not exist; use the device setup() returns, cuda:LOCAL_RANK (M6)"
            )
    return None


def moved_after_wrap(source: str) -> str | None:
    """The first line of ``source`` that moves the model (or its DDP wrapper) once DDP(...) has wrapped it,
    named as a slip; None when none does (or the script does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines = source.splitlines()
    wraps = []
    for node in ast.walk(tree):
        value = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
        calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)] if value is not None else []
        for call in calls:
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if name in ("DDP", "DistributedDataParallel"):
                names = {a.id for a in call.args[:1] if isinstance(a, ast.Name)}
                if isinstance(node, ast.Assign):
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                wraps.append((call, names))
    for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda")
        ):
            continue
        moved = node.func.value
        for call, names in wraps:
            wrapped = moved is call or (isinstance(moved, ast.Name) and moved.id in names and node.lineno > call.lineno)
            if wrapped:
                return (
                    f"line {node.lineno} moves the model once DDP has wrapped it ({lines[node.lineno - 1].strip()}): "
                    "DDP registered its parameters where they were; move the model first, then wrap it (M7)"
                )
    return None
