"""parallel_course.training, the capstone trainer's parallel code, in one process: the table of
layouts (the process counts each accepts, its mesh, its refusals), every layout applied by its own
functions on a mesh of the size it asks for (torch's fake process group: one process stands for all),
the meshes made once per shape in a process group, and FSDP2's held gradients read or, on a torch
whose internals differ, left out with a note."""

import math
import types

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from parallel_course.fake_cluster import fake_world
from parallel_course.gpt import GPT, GPTConfig
from parallel_course.training import layouts, parallelize, step_metrics
from parallel_course.training.experts import apply_ep
from parallel_course.training.layouts import LAYOUTS, REST

COUNTS = range(1, 9)
# The order in which a layout's functions may be applied: a pipeline stage's share first, then tensor
# parallelism, then FSDP over what is left (TP-local parameters sharded further), or attention and
# experts, which change no weight's sharding. DDP wraps last.
ORDER = (parallelize.apply_pp, parallelize.apply_tp, parallelize.apply_fsdp, parallelize.apply_cp, apply_ep)


def mesh_sizes(spec: dict, n: int) -> dict | None:
    """The sizes of a mesh spec on n processes, worked out here apart from the table's code; None
    where the mesh cannot be made of n (the fixed sizes do not divide it, or, without a dimension
    taking the rest, are not n)."""
    fixed = math.prod(s for s in spec.values() if s != REST)
    fits = n % fixed == 0 if REST in spec.values() else n == fixed
    return {d: n // fixed if s == REST else s for d, s in spec.items()} if fits else None


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_runs_where_its_mesh_can_be_made_and_refuses_the_others_in_one_line(name):
    """A count is refused only where the mesh cannot be made of it, or where a dimension that takes
    the rest would have a single rank (2d on 2 is tp; dp_ep on 2 is ep); an accepted count makes
    meshes whose sizes multiply to it."""
    layout = LAYOUTS[name]
    for n in COUNTS:
        specs = [layout.mesh] + ([layout.experts] if layout.experts else [])
        sizes = [mesh_sizes(spec, n) for spec in specs]
        if layout.refusal(n) is None:
            assert layout.processes.allows(n) and None not in sizes, (name, n)
            assert math.prod(layout.dims(n).values()) == n == math.prod((layout.expert_dims(n) or {0: n}).values())
            assert layout.dims(n) == {d: sizes[0].get(d, 1) for d in layout.dims(n)}
        else:
            single_rest = any(
                s is not None and any(s[d] == 1 for d, v in spec.items() if v == REST) for spec, s in zip(specs, sizes)
            )
            assert not layout.processes.allows(n) and (None in sizes or single_rest or n < 1), (name, n)
            line = layout.refusal(n)
            assert line.startswith(f"--parallel {name} (") and line.endswith(f"the world size is {n}"), line
            assert str(layout.processes) in line and "\n" not in line
    some = next(n for n in COUNTS if layout.processes.allows(n))
    assert list(layout.dims(some)) == [d for d in layouts.DIMENSIONS if d != "cp" or "cp" in layout.mesh]


def test_the_table_by_hand():
    assert LAYOUTS["2d"].dims(8) == {"dp": 4, "pp": 1, "tp": 2}
    assert LAYOUTS["cp"].dims(2) == {"dp": 1, "pp": 1, "cp": 2, "tp": 1}
    assert LAYOUTS["dp_pp"].dims(6) == {"dp": 3, "pp": 2, "tp": 1}
    assert LAYOUTS["dp_ep"].dims(4) == {"dp": 4, "pp": 1, "tp": 1}
    assert [LAYOUTS[n].expert_dims(4) for n in ("ep", "dp_ep")] == [
        {"expert_dp": 1, "ep": 4},
        {"expert_dp": 2, "ep": 2},
    ]
    assert [n for n in LAYOUTS if LAYOUTS[n].processes.allows(3)] == ["ddp", "fsdp", "tp", "ep"]
    # What --sequence-parallel, --sync-every-micro-batch and --moe-experts accept, read from the table.
    assert layouts.layouts_that("tensor_parallel") == "tp or 2d"
    assert layouts.layouts_that("defers_gradient_sync") == "ddp, fsdp or 2d"
    assert layouts.layouts_that("takes_experts") == "single, ep or dp_ep"
    text = layouts.help_table()
    assert all(f"\n  {name} " in text for name in LAYOUTS) and "apply_tp, apply_fsdp" in text


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_applies_its_functions_in_an_order_that_composes(name):
    layout = LAYOUTS[name]
    positions = [ORDER.index(f) for f in layout.apply]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), layout.apply
    assert layout.wrap in (None, parallelize.apply_ddp)


def smallest_count(layout) -> int:
    """The fewest processes the layout splits something over (single: its one)."""
    return next((n for n in COUNTS if n > 1 and layout.processes.allows(n)), 1)


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_shards_the_gpt_as_its_mesh_says(name):
    """Rank 1 (or 0) of a fake group of the fewest processes the layout splits over: the table's
    functions applied to the GPT on the meta device, this rank stores half the model or less where
    the layout shards parameters, all of it where it does not."""
    layout = LAYOUTS[name]
    n = smallest_count(layout)
    cfg = GPTConfig(moe_experts=4 if layout.experts else 0)
    whole = sum(p.numel() for p in GPT(cfg, activation_checkpointing=False).parameters())
    with fake_world(n, rank=min(1, n - 1)):
        meshes = layout.meshes("cpu", n)
        with torch.device("meta"):
            model = GPT(cfg)
        parallelize.parallelize(model, meshes, sequence_parallel=layout.tensor_parallel)
        local = sum(step_metrics.local(p).numel() for p in model.parameters())
        sharded = [n for n, p in model.named_parameters() if isinstance(p, DTensor)]
    # Nothing sharded where nothing is split; half or less of the model where something is.
    if name in ("single", "ddp", "cp"):
        assert local == whole and not sharded
    else:
        assert local <= 0.6 * whole and (sharded or name in ("pp", "ep", "dp_ep")), (name, local, whole)


def test_a_mesh_is_made_once_per_shape_in_a_process_group():
    with fake_world(4, rank=2):
        ddp, fsdp = LAYOUTS["ddp"].meshes("cpu", 4), LAYOUTS["fsdp"].meshes("cpu", 4)
        assert ddp.mesh is fsdp.mesh and LAYOUTS["2d"].meshes("cpu", 4).mesh is not ddp.mesh
        assert ddp.batch is not None and ddp.size("dp") == 4 and ddp.size("cp") == 1
        first = ddp.mesh
    with fake_world(4, rank=2):
        # A new process group: new meshes, none of the destroyed group's.
        assert LAYOUTS["ddp"].meshes("cpu", 4).mesh is not first
    assert not dist.is_initialized()


class _FakeFsdp(nn.Linear):
    """A module with FSDP2's state as torch 2.13 keeps it, or as another torch might."""

    def __init__(self, state):
        super().__init__(2, 2)
        self.state = state

    def _get_fsdp_state(self):
        return self.state


def _param(numel):
    return types.SimpleNamespace(unsharded_accumulated_grad=torch.zeros(numel))


def test_fsdp2s_held_gradients_are_read_or_left_out_with_a_note(monkeypatch, capsys):
    monkeypatch.setattr(step_metrics, "FSDPModule", _FakeFsdp)
    monkeypatch.setattr(step_metrics, "FSDP_NOTED", [])
    monkeypatch.setattr(step_metrics.dist, "get_rank", lambda: 0)
    group = types.SimpleNamespace(fsdp_params=[_param(3), _param(5)])
    # 2.13: a list of groups (per-parameter meshes); before: one group, or None.
    assert step_metrics.held_gradient_bytes(_FakeFsdp(types.SimpleNamespace(_fsdp_param_groups=[group]))) == 8 * 4
    assert step_metrics.held_gradient_bytes(_FakeFsdp(types.SimpleNamespace(_fsdp_param_group=group))) == 8 * 4
    assert step_metrics.held_gradient_bytes(_FakeFsdp(types.SimpleNamespace(_fsdp_param_group=None))) == 0
    assert capsys.readouterr().err == ""
    # Internals renamed: only .grad is counted, with one note (once per process).
    model = _FakeFsdp(types.SimpleNamespace())
    model.weight.grad = torch.ones(2, 2)
    assert step_metrics.held_gradient_bytes(model) == 4 * 4
    assert step_metrics.held_gradient_bytes(model) == 4 * 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"note: torch {torch.__version__} has no FSDP2 internals"), err
