"""Lab 15's model and layout: which rank holds which piece of which gradient, and the gradients the
checks hand out.

``TinyMoE``: blocks of a LayerNorm and an MLP split over tp (column- then row-parallel), the last with a
router and experts. ``Sizes``: a (dp, tp, pp) layout, its ranks in mesh order ("dp", "pp", "tp"):
rank = (dp · pp_size + pp) · tp_size + tp. ``pieces_of``: what a rank holds of the whole model's
gradient (its stage's parameters; of a tp_split one its tp rank's piece, of a tp_replicated one a copy,
of an expert a copy where its dp rank holds it); ``Layout``: a rank's group, place and size on each axis.
The gradients: one training step's (``step_gradient``), the probes (a gradient non-zero in one place or
two, each about one way of counting) and the clipping cases (a norm above and below max_norm, an inf,
a NaN). ``parallel_course.slips.global_norm`` checks the student's code with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from parallel_course.slips.simulated_group import Subgroup

KINDS = ("tp_split", "tp_replicated", "expert")
WIDTH, HIDDEN, BLOCKS, EXPERTS = 8, 16, 4, 6


# --- the model and its layout -------------------------------------------------------------------


class Block(nn.Module):
    """A norm, then an MLP whose first layer is split over tp by rows (column-parallel) and whose second
    by columns (row-parallel); with ``experts``, a top-1 mixture of experts after it."""

    def __init__(self, experts: int = 0):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)
        self.router = nn.Linear(WIDTH, experts, bias=False) if experts else None
        self.experts = nn.ModuleList(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(experts)) if experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        if self.experts is None:
            return x
        probs = self.router(x).softmax(-1)
        choice = probs.argmax(-1, keepdim=True)
        # Each token through its expert only, weighted by its probability.
        mixed = sum((choice == e) * probs[..., e : e + 1] * expert(x) for e, expert in enumerate(self.experts))
        return x + mixed


class TinyMoE(nn.Module):
    """The lab's model: BLOCKS blocks, the last with EXPERTS experts (1,616 parameters)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(EXPERTS if i == BLOCKS - 1 else 0) for i in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Sizes(NamedTuple):
    """A layout's sizes. Ranks in mesh order ("dp", "pp", "tp"): rank = (dp · pp_size + pp) · tp_size + tp."""

    dp: int
    tp: int
    pp: int

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> dict[str, int]:
        return {"dp": rank // (self.pp * self.tp), "pp": rank // self.tp % self.pp, "tp": rank % self.tp}

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        return (dp * self.pp + pp) * self.tp + tp

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks that share every coordinate of ``rank`` but ``axis``'s."""
        here = self.coords(rank)
        return tuple(self.rank_of(**{**here, axis: i}) for i in range(getattr(self, axis)))

    def __str__(self) -> str:
        return f"{self.world} rank{'s' if self.world > 1 else ''} (dp {self.dp} × tp {self.tp} × pp {self.pp})"


ONE, LAB = Sizes(1, 1, 1), Sizes(3, 2, 2)


def sizes_for(world_size: int) -> Sizes:
    """The layout the launched checker uses on ``world_size`` ranks: tp 2 where it divides, then pp 2."""
    tp = 2 if world_size % 2 == 0 else 1
    pp = 2 if world_size % (2 * tp) == 0 else 1
    return Sizes(world_size // (tp * pp), tp, pp)


@dataclass
class Piece:
    """One parameter's gradient as a rank holds it: its name in the model, this rank's piece of the
    gradient, and its kind (KINDS)."""

    name: str
    grad: torch.Tensor
    kind: str


@dataclass(frozen=True)
class Axis:
    """One axis of the layout as a rank sees it: the group of the ranks along it (this one among them),
    this rank's place in it, its size."""

    group: Any
    rank: int
    size: int


@dataclass(frozen=True)
class Layout:
    """A rank's three axes."""

    dp: Axis
    tp: Axis
    pp: Axis


def placement(name: str) -> tuple[str, int | None, int | None]:
    """A parameter's (kind, the dimension it is split along over tp, its expert's index)."""
    if ".experts." in name:
        return "expert", None, int(name.split(".experts.")[1].split(".")[0])
    if ".fc1." in name:
        return "tp_split", 0, None
    if name.endswith("fc2.weight"):
        return "tp_split", 1, None
    return "tp_replicated", None, None


def block_of(name: str) -> int:
    return int(name.split(".")[1])


def stage_of(name: str, sizes: Sizes) -> int:
    return block_of(name) * sizes.pp // BLOCKS


def expert_owner(expert: int, sizes: Sizes) -> int:
    """The dp rank that holds ``expert``: the experts cut into dp contiguous groups."""
    return expert * sizes.dp // EXPERTS


@cache
def parameter_shapes() -> dict[str, tuple[int, ...]]:
    """Every parameter's name in the model, and its shape."""
    return {name: tuple(p.shape) for name, p in TinyMoE().named_parameters()}


def parameter_names() -> tuple[str, ...]:
    return tuple(parameter_shapes())


def pieces_of(grads: dict[str, torch.Tensor], sizes: Sizes, rank: int) -> list[Piece]:
    """What ``rank`` holds of the whole model's gradient ``grads`` (as one process holds it): its stage's
    parameters; of a tp_split one its tp rank's piece, of a tp_replicated one a copy, of an expert a copy
    if its dp rank holds that expert. Every piece a tensor of its own."""
    here = sizes.coords(rank)
    found = []
    for name in parameter_names():
        if stage_of(name, sizes) != here["pp"]:
            continue
        kind, dim, expert = placement(name)
        if kind == "expert" and expert_owner(expert, sizes) != here["dp"]:
            continue
        grad = grads[name]
        if dim is not None:
            grad = grad.chunk(sizes.tp, dim=dim)[here["tp"]]
        found.append(Piece(name, grad.clone(), kind))
    return found


def simulated_layouts(sizes: Sizes) -> list[Layout]:
    """Every rank's Layout, its groups the simulated group's Subgroups."""
    layouts = []
    for rank in range(sizes.world):
        axes = {
            axis: Axis(Subgroup(sizes.group(rank, axis), axis), sizes.coords(rank)[axis], getattr(sizes, axis))
            for axis in ("dp", "tp", "pp")
        }
        layouts.append(Layout(**axes))
    return layouts


def describe_layout(sizes: Sizes = LAB) -> str:
    """Who holds what: the last block's gradients and what a rank holds of each, then the ranks of each
    dp and pp coordinate (a stage's tp ranks together) and the experts of each dp rank."""
    per_stage = BLOCKS // sizes.pp
    lines = [
        f"{sizes}: rank = (dp · {sizes.pp} + pp) · {sizes.tp} + tp",
        "",
        "the last block's gradients (the other blocks have the first six), and what a rank holds of each:",
    ]
    for name, shape in parameter_shapes().items():
        kind, dim, expert = placement(name)
        if block_of(name) != BLOCKS - 1 or (expert or 0) > 0:
            continue
        if kind == "tp_split":
            piece = list(shape)
            piece[dim] //= sizes.tp
            held = f"{tuple(piece)}, its tp rank's {'rows' if dim == 0 else 'columns'}"
        elif kind == "expert":
            held = "the whole, on the ranks of the dp rank that holds the expert (a copy on each tp rank)"
        else:
            held = "the whole, a copy on every tp rank"
        short = name.split(".", 2)[2].replace("experts.0.", f"experts.0-{EXPERTS - 1}.")
        lines.append(f"  {short:<20} {str(shape):<8} {kind:<14} {held}")
    stages = [f"pp {p} (blocks {p * per_stage}-{(p + 1) * per_stage - 1})" for p in range(sizes.pp)]
    lines += ["", " " * 8 + "".join(stage.ljust(22) for stage in stages) + f"experts (in pp {sizes.pp - 1})"]
    for d in range(sizes.dp):
        ranks = [", ".join(str(sizes.rank_of(d, p, t)) for t in range(sizes.tp)) for p in range(sizes.pp)]
        held = [e for e in range(EXPERTS) if expert_owner(e, sizes) == d]
        experts = f"{held[0]}-{held[-1]}" if len(held) > 1 else f"{held[0]}" if held else "none"
        lines.append(f"dp {d}    " + "".join(f"ranks {r}".ljust(22) for r in ranks) + experts)
    return "\n".join(lines)


# --- the gradients the checks hand out ------------------------------------------------------------


@cache
def _step() -> tuple[dict[str, torch.Tensor], float]:
    """One training step's gradient of the whole model in one process, and its norm by torch."""
    torch.manual_seed(0)
    model = TinyMoE()
    data = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, WIDTH, generator=data), torch.randn(64, WIDTH, generator=data)
    F.mse_loss(model(x), y).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return grads, torch.nn.utils.get_total_norm(list(grads.values())).item()


def step_gradient() -> tuple[dict[str, torch.Tensor], float]:
    """A copy of one training step's gradient (name -> tensor) and torch's norm of it."""
    grads, norm = _step()
    return {name: g.clone() for name, g in grads.items()}, norm


def clipped_by_torch(grads: dict[str, torch.Tensor], max_norm: float) -> dict[str, torch.Tensor]:
    """``grads`` clipped by torch.nn.utils.clip_grad_norm_ in one process."""
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads.values()]
    for p, g in zip(params, grads.values()):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return {name: p.grad for name, p in zip(grads, params)}


class Probe(NamedTuple):
    """A gradient non-zero in one place, or two (``parts``: the norms of each), and what it shows."""

    what: str
    grads: dict[str, torch.Tensor]
    kind: str
    parts: tuple[float, ...]
    # For two parts: across what they lie.
    across: str = ""

    @property
    def expected(self) -> float:
        return math.sqrt(sum(p * p for p in self.parts))


def put(grads: dict[str, torch.Tensor], name: str, value: float, sizes: Sizes, tp: int = 0) -> None:
    """Put ``value`` into ``grads[name]``, in tp rank ``tp``'s piece if the tensor is split."""
    _, dim, _ = placement(name)
    index = [0] * grads[name].dim()
    if dim is not None:
        index[dim] = tp * grads[name].shape[dim] // sizes.tp
    grads[name][tuple(index)] = value


def probes(sizes: Sizes) -> list[Probe]:
    """One probe per way of counting; the two-part ones only where their axis has two ranks."""
    last = f"blocks.{BLOCKS - 1}"
    second = next((e for e in range(EXPERTS) if expert_owner(e, sizes) == 1), None)

    def grads(*values: tuple[str, float, int]) -> dict[str, torch.Tensor]:
        found = {name: torch.zeros_like(g) for name, g in _step()[0].items()}
        for name, value, tp in values:
            put(found, name, value, sizes, tp)
        return found

    found = [
        Probe(
            "a split tensor, in tp rank 0's piece only (stage 0)",
            grads(("blocks.0.fc1.weight", 3, 0)),
            "tp_split",
            (3,),
        ),
        Probe(
            f"a replicated tensor (stage {sizes.pp - 1})", grads((f"{last}.norm.weight", 3, 0)), "tp_replicated", (3,)
        ),
        Probe("one expert, held by dp rank 0", grads((f"{last}.experts.0.weight", 3, 0)), "expert", (3,)),
    ]
    if sizes.tp > 1:
        found.append(
            Probe(
                "3 in tp rank 0's piece, 4 in tp rank 1's",
                grads(("blocks.0.fc1.weight", 3, 0), ("blocks.0.fc1.weight", 4, 1)),
                "tp_split",
                (3, 4),
                "the tp ranks",
            )
        )
    if sizes.pp > 1:
        found.append(
            Probe(
                "3 in stage 0, 4 in the last stage",
                grads(("blocks.0.fc1.weight", 3, 0), (f"{last}.fc1.weight", 4, 0)),
                "tp_split",
                (3, 4),
                "the stages",
            )
        )
    found.append(
        Probe(
            "3 in a split tensor, 4 in a replicated one",
            grads(("blocks.0.fc1.weight", 3, 0), ("blocks.0.norm.weight", 4, 0)),
            "tp_split",
            (3, 4),
            "the kinds of piece (split, replicated)",
        )
    )
    found.append(
        Probe(
            "3 in an expert, 4 in a split tensor",
            grads((f"{last}.experts.0.weight", 3, 0), (f"{last}.fc1.weight", 4, 0)),
            "expert",
            (3, 4),
            "the experts and the rest",
        )
    )
    if second is not None:
        found.append(
            Probe(
                "3 in dp rank 0's expert, 4 in dp rank 1's",
                grads((f"{last}.experts.0.weight", 3, 0), (f"{last}.experts.{second}.weight", 4, 0)),
                "expert",
                (3, 4),
                "the dp ranks' experts",
            )
        )
    return found


class ClipCase(NamedTuple):
    """A clipping case: the whole gradient, max_norm, whether the step goes on, and either the gradient
    clip_grad_norm_ leaves (``expected``) or the parameter holding the non-finite value (``bad``)."""

    what: str
    grads: dict[str, torch.Tensor]
    max_norm: float
    step: bool
    expected: dict[str, torch.Tensor] | None = None
    bad: str = ""


def clip_cases(sizes: Sizes) -> list[ClipCase]:
    """A norm above max_norm, one below, an inf in an expert and a NaN in a split piece."""
    grads, norm = step_gradient()
    last = f"blocks.{BLOCKS - 1}"
    expert, split = f"{last}.experts.{EXPERTS - 1}.weight", "blocks.0.fc1.weight"
    with_inf, with_nan = step_gradient()[0], step_gradient()[0]
    put(with_inf, expert, math.inf, sizes)
    put(with_nan, split, math.nan, sizes, tp=sizes.tp - 1)
    held = f"held by dp rank {expert_owner(EXPERTS - 1, sizes)}"
    return [
        ClipCase("a norm above max_norm", grads, norm / 2, True, clipped_by_torch(grads, norm / 2)),
        ClipCase("a norm below max_norm", grads, 2 * norm, True, grads),
        ClipCase(f"an inf in expert {EXPERTS - 1} ({held})", with_inf, norm / 2, False, bad=expert),
        ClipCase(f"a NaN in tp rank {sizes.tp - 1}'s piece of {split}", with_nan, norm / 2, False, bad=split),
    ]
