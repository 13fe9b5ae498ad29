"""parallel_course.compat: the names a torch 2.11/2.12 has for the single-tensor collectives, and a
group's timeout changed after the join; older torch faked by removing 2.13's attributes."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from parallel_course import compat


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    yield dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()


def recorder(calls, name, original):
    def recorded(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    return recorded


# Faking 2.12 on 2.13 calls 2.13's deprecated aliases, which warn.
@pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")
@pytest.mark.parametrize("older", [False, True], ids=["torch 2.13", "torch 2.12 (no _single names)"])
def test_the_single_tensor_collectives_use_the_name_the_running_torch_has(group_of_one, monkeypatch, older):
    calls = []
    for name in (*compat.NAMES["all_gather_single"], *compat.NAMES["reduce_scatter_single"]):
        monkeypatch.setattr(dist, name, recorder(calls, name, getattr(dist, name)))
    if older:
        monkeypatch.delattr(dist, "all_gather_single")
        monkeypatch.delattr(dist, "reduce_scatter_single")
    shard = torch.arange(3.0)
    full = torch.empty(3)
    compat.all_gather_single(full, shard)
    out = torch.empty(3)
    compat.reduce_scatter_single(out, shard * 2)
    assert torch.equal(full, shard) and torch.equal(out, shard * 2)
    if older:
        assert calls == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        assert compat.present_names("all_gather_single") == ("all_gather_into_tensor",)
    else:
        assert calls == ["all_gather_single", "reduce_scatter_single"]
        assert compat.present_names("all_gather_single") == ("all_gather_single", "all_gather_into_tensor")


def test_a_torch_with_neither_name_is_named_in_the_error(monkeypatch):
    monkeypatch.delattr(dist, "all_gather_single")
    monkeypatch.delattr(dist, "all_gather_into_tensor")
    with pytest.raises(AttributeError, match=r"none of .*all_gather_into_tensor.* \(torch 2\."):
        compat.present_names("all_gather_single")


def test_the_collective_timeout_changes_after_the_join(group_of_one, monkeypatch):
    gloo = group_of_one._get_backend(torch.device("cpu"))
    assert gloo.options._timeout == timedelta(seconds=30)
    compat.set_collective_timeout(4)
    assert gloo.options._timeout == timedelta(seconds=4)
    # A torch with a public set_timeout: that one is called, with the timeout and the group.
    seen = []
    monkeypatch.setattr(dist, "set_timeout", lambda timeout, group: seen.append((timeout, group)), raising=False)
    compat.set_collective_timeout(2.5, group_of_one)
    assert seen == [(timedelta(seconds=2.5), group_of_one)]
    assert gloo.options._timeout == timedelta(seconds=4)
