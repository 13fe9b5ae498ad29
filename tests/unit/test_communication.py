"""parallel_course.communication: bytes formulas on hand-worked cases; the counter on DDP's hooks
in a gloo group of one; DiLoCo's outer step against its arithmetic by hand. FSDP2 calls no
collective in a group of one: the HSDP formula is checked against the count on 4 ranks, and
the hooks and the outer step on 2, in chapter 14c's notebook."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from parallel_course import communication as comm

SHAPES = [(128, 64), (128,), (128, 128), (128,), (10, 128), (10,)]


@pytest.fixture(scope="module")
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ring_bytes_sent_by_hand():
    assert comm.ring_bytes_sent("all_reduce", 1000, 4) == 1500
    assert comm.ring_bytes_sent("all_gather_single", 250, 4) == 750
    assert comm.ring_bytes_sent("reduce_scatter_single", 1000, 4) == 750
    assert comm.ring_bytes_sent("all_reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        comm.ring_bytes_sent("broadcast", 8, 2)


def test_bucket_and_fp16_bytes():
    elements = 128 * 64 + 128 + 128 * 128 + 128 + 10 * 128 + 10
    assert comm.bucket_bytes(SHAPES) == 4 * elements == 104_488
    assert comm.fp16_bytes(SHAPES) == 2 * elements


def test_powersgd_compresses_matrices_worth_it():
    # (n + m) r * 2 < n m: 128 x 64 at rank 2 sends 384 elements instead of 8,192.
    assert comm.powersgd_compressed(128, 64, 2)
    # A bias is a 128 x 1 matrix: rank min(128, 1, 2) = 1, (128 + 1) * 2 > 128, sent whole.
    assert not comm.powersgd_compressed(128, 1, 2)
    # 4 x 4 at rank 2: 16 elements against (4 + 4) * 2 * 2 = 32: not worth it.
    assert not comm.powersgd_compressed(4, 4, 2)
    counts = comm.powersgd_elements(SHAPES, rank=2)
    assert counts == {"uncompressed": 128 + 128 + 10, "P": 2 * (128 + 128 + 10), "Q": 2 * (64 + 128 + 128)}
    assert comm.powersgd_step_bytes(SHAPES, 2, step=4, start_iter=4) == 104_488
    assert comm.powersgd_step_bytes(SHAPES, 2, step=5, start_iter=4) == 4 * (266 + 532 + 640)


def ddp_step_bytes(hook, state, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)))
    model.register_comm_hook(state, hook)
    per_step = []
    with comm.CollectiveCounter() as counter:
        for step in range(steps):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))
            model(x).square().mean().backward()
            per_step.append(comm.totals(counter.clear()))
    return per_step


def test_counter_sees_what_the_hooks_send(group_of_one):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    plain = ddp_step_bytes(default_hooks.allreduce_hook, None, 2)
    assert [s["payload_bytes"] for s in plain] == [comm.bucket_bytes(SHAPES)] * 2
    half = ddp_step_bytes(default_hooks.fp16_compress_hook, None, 2)
    assert [s["payload_bytes"] for s in half] == [comm.fp16_bytes(SHAPES)] * 2
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    power = ddp_step_bytes(powerSGD_hook.powerSGD_hook, state, 4)
    assert [s["payload_bytes"] for s in power] == [comm.powersgd_step_bytes(SHAPES, 2, k, 2) for k in (1, 2, 3, 4)]
    # After the warm-up: the uncompressed tensors, then P, then Q.
    assert [s["calls"] for s in power] == [1, 1, 3, 3]
    # The counter puts torch.distributed back as it was.
    assert dist.all_reduce.__name__ == "all_reduce"


def test_hsdp_formula_and_links_by_hand():
    calls = comm.sharded_step_calls([1000], replicate=2, shard=2, regathered=[True])
    assert [(c["op"], c["group_size"], c["payload_bytes"]) for c in calls] == [
        ("all_gather_single", 2, 2000),
        ("all_gather_single", 2, 2000),
        ("reduce_scatter_single", 2, 4000),
        ("all_reduce", 2, 2000),
    ]
    records = [
        comm.Call("all_gather_single", 2, (0, 1), torch.float32, 2000),
        comm.Call("reduce_scatter_single", 2, (0, 1), torch.float32, 4000),
        comm.Call("all_reduce", 2, (0, 2), torch.float32, 2000),
    ]
    # Two ranks a node: (0, 1) stay inside node 0; (0, 2) crosses to node 1.
    assert comm.bytes_by_link(records, ranks_per_node=2) == {"intra-node": 2000 + 2000, "inter-node": 2000}
    assert comm.bytes_by_link(records, ranks_per_node=4) == {"intra-node": 6000, "inter-node": 0}


def fake_average_with(other):
    """A stand-in for all_reduce(AVG) over two ranks, the other one holding `other`."""

    def all_reduce(tensor, op=None, group=None, async_op=False):
        tensor.add_(other).div_(2)

    return all_reduce


def test_outer_step_plain_sgd_is_the_average_of_the_weights(monkeypatch):
    model = nn.Linear(3, 2)
    outer = comm.OuterStep(model, lr=1.0, momentum=0.0, nesterov=False)
    start = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.5)
    # The other rank moved by 0.1 from the same start: its pseudo-gradient is 0.1 everywhere.
    monkeypatch.setattr(dist, "all_reduce", fake_average_with(torch.full((8,), 0.1)))
    outer.step()
    for p, s in zip(model.parameters(), start):
        torch.testing.assert_close(p.detach(), s - 0.3)
    for a, p in zip(outer.anchor, model.parameters()):
        assert torch.equal(a.detach(), p.detach())


def test_outer_step_nesterov_by_hand(monkeypatch):
    model = nn.Linear(2, 1, bias=False)
    outer = comm.OuterStep(model, lr=0.7, momentum=0.9)
    start = model.weight.detach().clone()
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: None)
    with torch.no_grad():
        model.weight.sub_(1.0)
    outer.step()
    # Pseudo-gradient d = 1; momentum buffer b = d; Nesterov's step d + 0.9 b = 1.9 d, times 0.7.
    torch.testing.assert_close(model.weight.detach(), start - 0.7 * 1.9)
    with torch.no_grad():
        model.weight.sub_(1.0)
    before = model.weight.detach().clone() + 1.0
    outer.step()
    # b = 0.9 * 1 + 1 = 1.9; step d + 0.9 b = 1 + 1.71.
    torch.testing.assert_close(model.weight.detach(), before - 0.7 * 2.71)


def test_local_sgd_sync_bytes():
    assert comm.local_sgd_sync_bytes(1000, 64, 16) == {"all_reduces": 4, "per_step_bytes": 250.0}
    assert comm.local_sgd_sync_bytes(1000, 64, 1)["per_step_bytes"] == 4000
    with pytest.raises(ValueError, match="multiple of H"):
        comm.local_sgd_sync_bytes(1000, 64, 5)
