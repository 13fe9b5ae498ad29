"""parallel_course.communication: bytes formulas on hand-worked cases; the counter on DDP's hooks
in a gloo group of one, and on a torch without 2.13's collective names (faked); bytes across nodes
counted on the ring's edges, by hand and against closed forms; DiLoCo's outer step against its
arithmetic by hand. FSDP2 calls no collective in a group of one: the HSDP formula is checked
against the count on 4 ranks, and the hooks and the outer step on 2, in chapter 14c's notebook."""

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


def test_the_counter_names_each_collective_the_same_on_older_torch(group_of_one, monkeypatch):
    full, shard = torch.empty(4), torch.arange(4.0)
    with comm.CollectiveCounter() as counter:
        # torch 2.13: the deprecated alias forwards to all_gather_single inside torch, counted once.
        with pytest.warns(FutureWarning):
            dist.all_gather_into_tensor(full, shard)
        dist.all_gather_single(full, shard)
    assert [(c.op, c.payload_bytes) for c in counter.calls] == [("all_gather_single", 16)] * 2
    # torch 2.12 has only the older names (FSDP2 calls them there): counted under the same names.
    monkeypatch.delattr(dist, "all_gather_single")
    monkeypatch.delattr(dist, "reduce_scatter_single")
    with comm.CollectiveCounter() as counter, pytest.warns(FutureWarning):
        dist.all_gather_into_tensor(full, shard)
        dist.reduce_scatter_tensor(output=torch.empty(4), input=shard)
    assert [c.op for c in counter.calls] == ["all_gather_single", "reduce_scatter_single"]
    assert not hasattr(dist, "all_gather_single"), "the counter must not add names torch lacks"


def test_mesh_groups_and_the_ring_neighbour():
    # Ranks 0-3 on node 0 and 4-7 on node 1 of a (2, 4) mesh: rank 5 shards with its node, and
    # replicates with rank 1, the rank at the same place on the other node.
    assert comm.mesh_groups(5, replicate=2, shard=4) == {"shard": (4, 5, 6, 7), "replicate": (1, 5)}
    assert comm.ring_next(3, (0, 1, 2, 3)) == 0 and comm.ring_next(1, (3, 1)) == 3


def test_hsdp_fsdp_ddp_bytes_across_nodes_by_hand():
    # 1000 parameters (G = 4000 bytes), 4 ranks on 2 nodes of 2.
    calls = comm.sharded_step_calls([1000], replicate=2, shard=2, regathered=[True], rank=0)
    assert [(c["op"], c["ranks"], c["payload_bytes"]) for c in calls] == [
        ("all_gather_single", (0, 1), 2000),
        ("all_gather_single", (0, 1), 2000),
        ("reduce_scatter_single", (0, 1), 4000),
        ("all_reduce", (0, 2), 2000),
    ]
    hsdp = {r: comm.sharded_step_calls([1000], 2, 2, [True], rank=r) for r in range(4)}
    fsdp = {r: comm.sharded_step_calls([1000], 1, 4, [True], rank=r) for r in range(4)}
    ddp = {r: [comm.Call("all_reduce", 4, (0, 1, 2, 3), torch.float32, 4000)] for r in range(4)}
    # HSDP, each rank: all-gathers 2 x 2000 and reduce-scatter 2000 to its node's other rank; its
    # all-reduce of the shard, 2 (2 - 1) / 2 x 2000 = 2000, to the other node.
    assert comm.bytes_by_link(hsdp, ranks_per_node=2) == {"intra-node": 4 * 6000, "inter-node": 4 * 2000}
    # FSDP, each rank: all-gathers 2 x 3 x 1000, reduce-scatter 3 / 4 x 4000: 9000 to the next rank;
    # 1 -> 2 and 3 -> 0 leave their node, 0 -> 1 and 2 -> 3 do not.
    assert comm.bytes_by_link(fsdp, ranks_per_node=2) == {"intra-node": 2 * 9000, "inter-node": 2 * 9000}
    # DDP, each rank: 2 (4 - 1) / 4 x 4000 = 6000, on the same ring.
    assert comm.bytes_by_link(ddp, ranks_per_node=2) == {"intra-node": 2 * 6000, "inter-node": 2 * 6000}
    # Across nodes HSDP sends 8000 / 12000 = 2/3 of DDP's bytes and 8000 / 18000 = 4/9 of FSDP's.
    # On one node of 4, nothing crosses.
    assert comm.bytes_by_link(fsdp, ranks_per_node=4)["inter-node"] == 0


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (4, 2), (3, 4), (8, 8)])
def test_bytes_leaving_a_node_match_the_closed_forms(nodes, per_node):
    n = nodes * per_node
    elements = [n * nodes * 60, n * nodes * 12]
    g = 4 * sum(elements)
    ranks = tuple(range(n))
    model = {
        "hsdp": {r: comm.sharded_step_calls(elements, nodes, per_node, [True, True], rank=r) for r in ranks},
        "fsdp": {r: comm.sharded_step_calls(elements, 1, n, [True, True], rank=r) for r in ranks},
        "ddp": {r: [comm.Call("all_reduce", n, ranks, torch.float32, g)] for r in ranks},
    }
    for layout, calls in model.items():
        per_node_bytes = comm.bytes_by_link(calls, per_node)["inter-node"] / nodes
        assert per_node_bytes == pytest.approx(comm.cross_node_bytes_per_node(layout, g, nodes, per_node)), layout
    # HSDP's bytes across nodes approach DDP's as nodes are added: 2 (r - 1) / r against 2 (N - 1) / N.
    ratio = comm.cross_node_bytes_per_node("hsdp", g, nodes, per_node) / comm.cross_node_bytes_per_node(
        "ddp", g, nodes, per_node
    )
    assert ratio == pytest.approx((nodes - 1) / nodes * n / (n - 1))


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


def test_describe_leaving_says_each_layouts_bytes_per_node_count():
    alt = comm.describe_leaving([2, 4], {"ddp": [1.875, 1.9375], "hsdp": [1.0, 1.5]}, {"ddp": "DDP", "hsdp": "HSDP"}, 8)
    assert "against 2 to 4 nodes of 8 GPUs" in alt
    assert "DDP: 1.88 at 2, 1.94 at 4; HSDP: 1.00 at 2, 1.50 at 4." in alt


def test_describe_local_sgd_says_each_runs_first_and_last_window_and_its_held_out_point():
    runs = {
        "sync": {"losses": [4.0, 2.0, 1.0, 1.0], "held_out": 0.5, "payload_bytes": 4000},
        "H=4": {"losses": [3.0, 3.0, 2.0, 0.0], "held_out": 0.75, "payload_bytes": 1000},
    }
    alt = comm.describe_local_sgd(runs, steps=4, window=2)
    assert "sync: training loss 3.000 at step 2, 1.000 at step 4; held-out loss 0.5000 at 1,000 bytes per step" in alt
    assert "H=4: training loss 3.000 at step 2, 1.000 at step 4; held-out loss 0.7500 at 250 bytes per step." in alt
