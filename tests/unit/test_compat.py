"""parallel_course.compat: what a torch 2.11/2.12 has where the course uses torch 2.13's, each fact
once: versions read from any build string and the one-line notes and refusals that name them; DDP's
buffer-sync keyword; the names of the single-tensor collectives; a group's timeout changed after the
join. An older torch is faked by version strings, and by classes and modules without 2.13's names."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from helpers import load_script
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


def test_versions_are_read_from_any_build_string():
    assert compat.version_tuple("2.12.1+cu130") == (2, 12)
    assert compat.version_tuple("2.13.0a0+git1234abc") == (2, 13)
    assert compat.version_tuple("2.9.0") == (2, 9)  # not "2.9" > "2.13" as strings
    with pytest.raises(ValueError):
        compat.version_tuple("nightly")
    assert (
        compat.at_least("2.13", "2.13.0")
        and compat.at_least("2.11", "2.13.0")
        and not compat.at_least("2.13", "2.12.1")
    )
    assert compat.at_least("2.13") == (compat.version_tuple(torch.__version__) >= (2, 13))


def test_a_refusal_is_one_line_naming_both_versions():
    line = compat.refusal("the flight recorder's JSON dump", "2.13", version="2.11.0+cu128")
    assert line == "the flight recorder's JSON dump needs torch 2.13 or newer; this is torch 2.11.0+cu128"
    assert "\n" not in line
    assert compat.refusal("anything", "2.13", version="2.13.0") is None
    note = compat.note("X(y=)", "z instead", version="2.12.0")
    assert note == "note: torch 2.12.0 has no X(y=) (torch 2.13): z instead" and "\n" not in note


def test_ddp_buffer_sync_uses_the_keyword_this_torch_has():
    class Ddp213:
        def __init__(self, module, forward_sync_buffers=True, broadcast_buffers=True): ...

    class Ddp212:
        def __init__(self, module, broadcast_buffers=True, **kwargs): ...

    assert compat.ddp_buffer_sync(False, Ddp213) == ({"forward_sync_buffers": False}, None)
    kwargs, note = compat.ddp_buffer_sync(False, Ddp212)
    assert kwargs == {"broadcast_buffers": False}
    assert note.startswith(f"note: torch {torch.__version__} has no DDP(forward_sync_buffers=)"), note
    # This torch (2.13, the course's pin) has it.
    if compat.at_least("2.13"):
        assert compat.ddp_buffer_sync(True) == ({"forward_sync_buffers": True}, None)


def test_accepts_keyword():
    def f(a, b=1): ...

    def g(a, **kwargs): ...

    assert compat.accepts_keyword(f, "b") and not compat.accepts_keyword(f, "c") and compat.accepts_keyword(g, "c")
    assert not compat.accepts_keyword(len, "x") or True  # a builtin without a signature: no error


def test_c05_shows_buffer_sync_on_a_torch_without_forward_sync_buffers(monkeypatch, capsys):
    """The lesson (rank 0's buffers broadcast before each forward, or not) on a DDP that has only
    broadcast_buffers=: the same two lines, after one note."""
    import warnings

    import torch.distributed as dist
    import torch.nn.parallel

    c05 = load_script("c05_controlling_sync.py")
    real = torch.nn.parallel.DistributedDataParallel
    seen = []

    class OlderDDP(real):
        def __init__(self, module, broadcast_buffers=True):
            seen.append(broadcast_buffers)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # 2.13 still takes it, warning
                super().__init__(module, broadcast_buffers=broadcast_buffers)

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", OlderDDP)
    monkeypatch.setattr(c05, "DDP", OlderDDP)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        c05.buffer_sync(torch.device("cpu"), torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))
    finally:
        dist.destroy_process_group()
    lines = capsys.readouterr().out.splitlines()
    assert seen == [True, False]
    assert lines[0].startswith("note: torch ") and "broadcast_buffers= instead" in lines[0], lines
    flags = [line.split(":")[0].strip() for line in lines[1:]]
    assert flags == ["forward_sync_buffers=True", "forward_sync_buffers=False"], lines
