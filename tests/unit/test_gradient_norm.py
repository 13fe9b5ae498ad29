"""parallel_course.training.gradient_norm, on gradients set by hand: the whole model's norm, clipping
by it, a non-finite norm, and each classic slip.

In a gloo group of one: plain tensors and DTensors (sharded, replicated, partial) on a mesh of one,
against sums of squares worked out by hand and against torch's clip_grad_norm_ on the course's GPT.
Then layouts of several ranks simulated in this process: each rank's code run once to record what it
gives every collective, then again with each collective's result (``Replay``), so that a pipeline's
stages, the experts of an ep group and ddp's replicas reduce as they would on their ranks.
"""

import math
import types

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from parallel_course.gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum
from parallel_course.training import gradient_norm as gn


@pytest.fixture(scope="module")
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    dist.destroy_process_group()


def model_with(grads: dict[str, torch.Tensor]) -> nn.Module:
    """A module whose parameters, by name (dots allowed), hold these gradients."""
    model = nn.Module()
    for name, grad in grads.items():
        owner = model
        *path, last = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(last, nn.Parameter(torch.zeros_like(grad)))
        getattr(owner, last).grad = grad.clone()
    return model


def test_the_norm_of_every_gradient_and_clipping_by_it(group_of_one):
    # 3-4-12-13: squares 9 + 16 + 144 = 169; one parameter without a gradient is left out.
    model = model_with({"a": torch.tensor([3.0, 4.0]), "b.weight": torch.tensor([[12.0]])})
    model.register_parameter("unused", nn.Parameter(torch.ones(3)))
    norm = gn.gradient_norm(model)
    assert norm.item() == pytest.approx(13.0)
    assert gn.clip_gradients(model, 20.0, norm) == 1.0 and model.a.grad.tolist() == [3.0, 4.0]
    factor = gn.clip_gradients(model, 6.5, norm)
    assert factor == pytest.approx(0.5) and model.a.grad.tolist() == pytest.approx([1.5, 2.0])
    assert gn.gradient_norm(model).item() == pytest.approx(6.5)


def test_dtensor_gradients_are_counted_by_their_placements(group_of_one):
    """Sharded, replicated and partial gradients, and an expert's, on a mesh of one: each once."""
    mesh = group_of_one
    grads = {
        "shard": distribute_tensor(torch.tensor([1.0, 2.0]), mesh, [Shard(0)]),
        "copy": distribute_tensor(torch.tensor([2.0]), mesh, [Replicate()]),
        "partial": DTensor.from_local(torch.tensor([4.0]), mesh, [Partial()]),
    }
    # An expert is known by its name in the model.
    model = model_with({"blocks.0.mlp.experts.1.weight": torch.tensor([10.0])})
    for name, grad in grads.items():
        model.register_parameter(name, nn.Parameter(torch.zeros_like(grad)))
        getattr(model, name).grad = grad
    dense, experts = gn.square_sums(model)
    assert (dense.item(), experts.item()) == (1 + 4 + 4 + 16, 100)
    assert gn.gradient_norm(model).item() == pytest.approx(math.sqrt(125))


def test_equal_to_torch_clip_grad_norm_on_the_course_gpt(group_of_one):
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    x, y = AdditionTask(2).batch(torch.Generator().manual_seed(1), 8)
    loss_sum, count = answer_loss_sum(model(x), y)
    (loss_sum / count).backward()
    ours = gn.gradient_norm(model)
    torchs = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    assert ours.item() == pytest.approx(torchs.item(), rel=1e-6)


def test_a_nonfinite_gradient_gives_an_infinite_norm(group_of_one):
    model = model_with({"a": torch.tensor([3.0, 4.0])})
    gn.inject_nonfinite(model)
    assert math.isnan(model.a.grad[0].item())
    assert gn.gradient_norm(model).item() == math.inf


# --- several ranks simulated in this process ---------------------------------------------------


class Group:
    """A process group of the simulated ranks (its members' global ranks)."""

    def __init__(self, *members: int):
        self.members = members


class Replay:
    """dist.all_reduce for ranks run one after the other in this process. A pass runs every rank's
    code, each collective recording what the rank gives it (a rank's k-th call on a group is that
    group's k-th collective) and handing back the reduction of what its members gave, in this pass
    or the last; the passes repeat until every rank's result stays the same (a collective is right
    once those before it were in the pass before)."""

    def __init__(self, world: int):
        self.world, self.given, self.rank, self.calls = Group(*range(world)), {}, 0, {}

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None):
        group = group or self.world
        k = self.calls.setdefault((self.rank, group), 0)
        self.calls[(self.rank, group)] += 1
        values = self.given.setdefault((group, k), {})
        values[self.rank] = tensor.clone()
        if len(values) == len(group.members):
            stacked = torch.stack([values[r] for r in group.members])
            tensor.copy_(stacked.max(0).values if op == dist.ReduceOp.MAX else stacked.sum(0))

    def run(self, function, models, meshes) -> list[float]:
        """function(models[r], meshes[r]) on every rank r: the results once they stay the same."""
        self.given, results = {}, None
        for _ in range(10):
            self.calls, before = {}, results
            results = []
            for self.rank in range(len(models)):
                # Each pass from the gradients as they were: nothing here changes them.
                results.append(function(models[self.rank], meshes[self.rank]).item())
            if repr(results) == repr(before):
                return results
        raise AssertionError(f"the simulated collectives did not settle: {results}")


def simulated(monkeypatch, world: int) -> Replay:
    replay = Replay(world)
    monkeypatch.setattr(gn.dist, "all_reduce", replay.all_reduce)
    return replay


class Meshes:
    """What gradient_norm reads of a layout's meshes (layouts.Meshes): the pipeline's group and size,
    the experts' ep group."""

    def __init__(self, pp: Group | None = None, ep: Group | None = None):
        self.pp = pp
        self.experts = None if ep is None else types.SimpleNamespace(get_group=lambda dim: {"ep": ep}[dim])

    def size(self, dim: str) -> int:
        return len(self.pp.members) if dim == "pp" and self.pp else 1

    def __getitem__(self, dim: str):
        return types.SimpleNamespace(get_group=lambda: {"pp": self.pp}[dim])


def test_pipeline_stages_summed_and_the_slips_that_forget_it(monkeypatch):
    # Stage 0 holds 3 and 4, stage 1 holds 12: the model's norm is 13.
    models = [model_with({"a": torch.tensor([3.0, 4.0])}), model_with({"b": torch.tensor([12.0])})]
    pp = Group(0, 1)
    meshes = [Meshes(pp=pp), Meshes(pp=pp)]
    replay = simulated(monkeypatch, 2)
    assert replay.run(gn.gradient_norm, models, meshes) == pytest.approx([13.0, 13.0])
    assert replay.run(gn.stages_unreduced, models, meshes) == pytest.approx([5.0, 12.0])
    assert replay.run(gn.norms_added, models, meshes) == pytest.approx([17.0, 17.0])
    assert replay.run(gn.local_norm, models, meshes) == pytest.approx([5.0, 12.0])


def test_ddp_replicas_counted_once_and_the_slip_that_counts_them_all(monkeypatch):
    models = [model_with({"a": torch.tensor([3.0, 4.0])}) for _ in range(4)]
    meshes = [Meshes() for _ in range(4)]
    replay = simulated(monkeypatch, 4)
    assert replay.run(gn.gradient_norm, models, meshes) == pytest.approx([5.0] * 4)
    assert replay.run(gn.replicas_counted, models, meshes) == pytest.approx([10.0] * 4)
    # A rank's own copy is all of it here: the local norm is right in ddp.
    assert replay.run(gn.local_norm, models, meshes) == pytest.approx([5.0] * 4)


def test_experts_summed_over_their_ep_group_only(monkeypatch):
    """dp_ep on 4: ranks 0, 1 and 2, 3 are two ep groups; ranks 0 and 2 hold expert 0, 1 and 3 expert 1.
    The dense part (3, 4) is whole on every rank; expert 0's gradient is 12, expert 1's 84: 13 without
    experts, sqrt(25 + 144 + 7056) = 85 with."""
    expert = {0: 12.0, 1: 84.0}
    models = [
        model_with(
            {"dense": torch.tensor([3.0, 4.0]), f"blocks.0.mlp.experts.{r % 2}.w": torch.tensor([expert[r % 2]])}
        )
        for r in range(4)
    ]
    first, second = Group(0, 1), Group(2, 3)
    groups = {0: first, 1: first, 2: second, 3: second}
    meshes = [Meshes(ep=groups[r]) for r in range(4)]
    replay = simulated(monkeypatch, 4)
    assert replay.run(gn.gradient_norm, models, meshes) == pytest.approx([85.0] * 4)
    # Over every rank instead: each expert counted on its 2 replicas.
    twice = math.sqrt(25 + 2 * 144 + 2 * 84**2)
    assert replay.run(gn.experts_every_rank, models, meshes) == pytest.approx([twice] * 4)
    # Not reduced at all: each rank's own expert only.
    assert replay.run(gn.local_norm, models, meshes) == pytest.approx([13.0, math.sqrt(25 + 84**2)] * 2)


def test_every_rank_takes_the_largest_norm_a_nonfinite_one_winning(monkeypatch):
    """ddp on 2 with a NaN in rank 1's copy only: rank 0's own gradient is finite, its norm is not."""
    models = [model_with({"a": torch.tensor([3.0, 4.0])}) for _ in range(2)]
    gn.inject_nonfinite(models[1])
    replay = simulated(monkeypatch, 2)
    assert replay.run(gn.gradient_norm, models, [Meshes(), Meshes()]) == [math.inf, math.inf]
    assert replay.run(gn.local_norm, models, [Meshes(), Meshes()])[0] == pytest.approx(5.0)
