"""The capstone's layouts in one table: for each, the processes it runs on, its device mesh and
the functions that apply it, in order (torchtitan's ``ParallelDims`` plays this part there).

    LAYOUTS["2d"].dims(8)            # {'dp': 4, 'pp': 1, 'tp': 2}
    LAYOUTS["pp"].refusal(3)         # '--parallel pp runs on 2 processes (mesh pp 2), ...'
    meshes = LAYOUTS["2d"].meshes("cpu", 4)   # after the process group is joined

A mesh entry is a fixed size, or ``REST``: what the world size leaves once the fixed sizes are
taken (``{"dp": REST, "tp": 2}`` on 8 processes is dp 4 x tp 2). Every mesh has the dimensions
dp, pp and tp in that order (size 1 where a layout does not split), and cp only where a layout
splits the sequence. ``experts`` is the second mesh of the expert-parallel layouts, over the same
processes: the experts' replicas (expert_dp) by the ranks that share them out (ep).

What ``train_gpt.py`` refuses, what its ``--help`` lists and what the tests check are read from
this table; a new layout is a new row (and, if it needs one, a new apply function).
"""

# The table below is read as a table, a layout a line, wider than the course's 120 columns.
# ruff: noqa: E501

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .experts import apply_ep
from .parallelize import apply_cp, apply_ddp, apply_fsdp, apply_pp, apply_tp

# A mesh dimension that takes what the world size leaves once the fixed sizes are taken.
REST = "rest"
# The order of a mesh's dimensions (metrics.json's "mesh" keeps it).
DIMENSIONS = ("dp", "pp", "cp", "tp")


@dataclass(frozen=True)
class Processes:
    """The process counts a layout runs on: exactly one count, or at least some, in multiples."""

    exactly: int | None = None
    at_least: int = 1
    multiple_of: int = 1

    def allows(self, n: int) -> bool:
        if self.exactly is not None:
            return n == self.exactly
        return n >= self.at_least and n % self.multiple_of == 0

    def __str__(self) -> str:
        if self.exactly is not None:
            return "1 process" if self.exactly == 1 else f"{self.exactly} processes"
        if self.multiple_of > 1:
            return f"a multiple of {self.multiple_of} processes, at least {self.at_least}"
        return "any number of processes" if self.at_least == 1 else f"{self.at_least} processes or more"


@dataclass(frozen=True)
class Layout:
    """One row of the table (see the module's docstring)."""

    name: str
    summary: str
    processes: Processes
    mesh: dict = field(default_factory=dict)
    # Applied in this order, each changing the model in place.
    apply: tuple[Callable, ...] = ()
    # Then the wrapper the training calls, if any (DDP's).
    wrap: Callable | None = None
    experts: dict | None = None

    def dims(self, world_size: int) -> dict[str, int]:
        """The mesh's dimensions and their sizes on world_size processes, in DIMENSIONS' order."""
        sizes = _sizes(self.mesh, world_size)
        return {d: sizes.get(d, 1) for d in DIMENSIONS if d != "cp" or d in self.mesh}

    def expert_dims(self, world_size: int) -> dict[str, int] | None:
        """The experts' mesh, (expert_dp, ep), or None for a layout without one."""
        return None if self.experts is None else _sizes(self.experts, world_size)

    def refusal(self, world_size: int) -> str | None:
        """Why the layout cannot run on world_size processes, in one line; None if it can."""
        if self.processes.allows(world_size):
            return None
        return f"--parallel {self.name} ({self.summary}) runs on {self.processes}, but the world size is {world_size}"

    def splits(self, apply: Callable) -> bool:
        """Whether the layout applies this function."""
        return apply in self.apply or apply is self.wrap

    @property
    def tensor_parallel(self) -> bool:
        """Whether it splits the blocks' layers (--sequence-parallel splits what flows between them)."""
        return self.splits(apply_tp)

    @property
    def defers_gradient_sync(self) -> bool:
        """Whether its data-parallel reduction can wait for the last micro-batch (--sync-every-micro-batch
        changes something): DDP or FSDP over dp, outside a pipeline (whose schedule drives FSDP)."""
        return "dp" in self.mesh and (self.splits(apply_ddp) or self.splits(apply_fsdp)) and not self.splits(apply_pp)

    @property
    def dense(self) -> bool:
        """Whether every rank runs the GPT's own blocks on whole sequences: no pipeline stage, ring
        attention or experts spread (--dtype bfloat16, --float8 and --compile run there)."""
        return not (self.splits(apply_pp) or self.splits(apply_cp) or self.splits(apply_ep))

    @property
    def takes_experts(self) -> bool:
        """Whether --moe-experts may be used: the layouts that spread experts, and single (no parallelism)."""
        return self.experts is not None or not (self.apply or self.wrap)

    def meshes(self, device_type: str, world_size: int) -> Meshes:
        """The layout's device meshes in the process group this process has joined (a collective).
        One mesh per shape, made once per process group: a later training of the same shape in the
        same launch reuses it, so no communicator is made twice or destroyed while DeviceMesh holds it."""
        dims = self.dims(world_size)
        experts = self.expert_dims(world_size)
        return Meshes(
            self, dims, device_mesh(device_type, dims), None if experts is None else device_mesh(device_type, experts)
        )


def _sizes(spec: dict, world_size: int) -> dict[str, int]:
    fixed = math.prod(s for s in spec.values() if s != REST)
    return {d: world_size // fixed if s == REST else s for d, s in spec.items()}


ONE, TWO, ANY, FROM_2 = Processes(exactly=1), Processes(exactly=2), Processes(), Processes(at_least=2)
EVEN_FROM_4 = Processes(at_least=4, multiple_of=2)
# The experts' meshes: every rank a share of the experts (ep), or groups of 2 sharing them out,
# each group a replica of all experts (dp_ep).
ALL_RANKS, PAIRS = {"expert_dp": 1, "ep": REST}, {"expert_dp": REST, "ep": 2}

# fmt: off

# The table of layouts: a row each, read by train_gpt.py's checks and --help and by the tests.
LAYOUTS = {layout.name: layout for layout in [
    #      name      what it does                           processes    mesh                   applied in order        wrapper    experts
    Layout("single", "one process, the whole model",        ONE),
    Layout("ddp",    "whole copies, gradients all-reduced", ANY,         {"dp": REST},          (),                     apply_ddp),
    Layout("fsdp",   "ZeRO-3 over dp",                      ANY,         {"dp": REST},          (apply_fsdp,)),
    Layout("tp",     "every block's layers split",          ANY,         {"tp": REST},          (apply_tp,)),
    Layout("2d",     "tp in pairs, FSDP across them",       EVEN_FROM_4, {"dp": REST, "tp": 2}, (apply_tp, apply_fsdp)),
    Layout("pp",     "the blocks in 2 pipeline stages",     TWO,         {"pp": 2},             (apply_pp,)),
    Layout("dp_pp",  "FSDP over pipeline replicas",         EVEN_FROM_4, {"dp": REST, "pp": 2}, (apply_pp, apply_fsdp)),
    Layout("cp",     "sequences split, ring attention",     TWO,         {"cp": 2},             (apply_cp,),            apply_ddp),
    Layout("ep",     "experts spread over every rank",      FROM_2,      {"dp": REST},          (apply_ep,),            None,      ALL_RANKS),
    Layout("dp_ep",  "experts over pairs of ranks",         EVEN_FROM_4, {"dp": REST},          (apply_ep,),            None,      PAIRS),
]}
# fmt: on


def layouts_that(property_name: str) -> str:
    """The names of the layouts with a property, as a sentence says them: "ddp, fsdp or 2d"."""
    names = [name for name, layout in LAYOUTS.items() if getattr(layout, property_name)]
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def help_table() -> str:
    """The table as --help prints it: a layout a line, what it does, its processes, what it applies."""
    lines = ["layouts (--parallel), the processes each runs on, and what it applies in order:"]
    for layout in LAYOUTS.values():
        steps = ", ".join(f.__name__ for f in (*layout.apply, *([layout.wrap] if layout.wrap else [])))
        lines.append(f"  {layout.name:7}{layout.summary:37}{str(layout.processes):40}{steps or '-'}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Meshes:
    """A layout on this process group: its dimensions, its device mesh, and the experts' mesh (or None)."""

    layout: Layout
    dims: dict[str, int]
    mesh: DeviceMesh
    experts: DeviceMesh | None = None

    def __getitem__(self, dim: str) -> DeviceMesh:
        """The sub-mesh of one dimension (dp, pp, cp, tp)."""
        return self.mesh[dim]

    def size(self, dim: str) -> int:
        return self.dims.get(dim, 1)

    @property
    def batch(self) -> DeviceMesh:
        """The ranks that share each global batch and average their gradients: dp (rows of the batch),
        or cp (positions of each sequence) where the layout splits the sequence."""
        return self.mesh["cp"] if "cp" in self.dims else self.mesh["dp"]


# The meshes made so far in this process group, by device type and shape. The group is held
# weakly: a cache that held it would keep it, and gloo's threads, alive past teardown().
_MESHES: dict = {"world": lambda: None, "made": {}}


def device_mesh(device_type: str, dims: dict[str, int]) -> DeviceMesh:
    """init_device_mesh with these named dimensions, made once per process group (a collective the
    first time): the same shape asked for again returns the same mesh."""
    world = dist.distributed_c10d._get_default_group()
    if _MESHES["world"]() is not world:
        _MESHES["world"], _MESHES["made"] = weakref.ref(world), {}
    key = (device_type, tuple(dims.items()))
    if key not in _MESHES["made"]:
        _MESHES["made"][key] = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    return _MESHES["made"][key]
