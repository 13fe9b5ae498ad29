"""An older torch (a cluster's 2.11 or 2.12) meets the course's 2.13 features with a note or a
one-line refusal, found by looking at what torch has; faked here by version strings and by
classes and modules without the 2.13 names."""

import types

import pytest
import torch
from torch import nn

from helpers import load_script
from parallel_course import torch_features as tf


def test_versions_are_read_from_any_build_string():
    assert tf.version_tuple("2.12.1+cu130") == (2, 12)
    assert tf.version_tuple("2.13.0a0+git1234abc") == (2, 13)
    assert tf.version_tuple("2.9.0") == (2, 9)  # not "2.9" > "2.13" as strings
    with pytest.raises(ValueError):
        tf.version_tuple("nightly")
    assert tf.at_least("2.13", "2.13.0") and tf.at_least("2.11", "2.13.0") and not tf.at_least("2.13", "2.12.1")
    assert tf.at_least("2.13") == (tf.version_tuple(torch.__version__) >= (2, 13))


def test_a_refusal_is_one_line_naming_both_versions():
    line = tf.refusal("the flight recorder's JSON dump", "2.13", version="2.11.0+cu128")
    assert line == "the flight recorder's JSON dump needs torch 2.13 or newer; this is torch 2.11.0+cu128"
    assert "\n" not in line
    assert tf.refusal("anything", "2.13", version="2.13.0") is None
    note = tf.note("X(y=)", "z instead", version="2.12.0")
    assert note == "note: torch 2.12.0 has no X(y=) (torch 2.13): z instead" and "\n" not in note


def test_ddp_buffer_sync_uses_the_keyword_this_torch_has():
    class Ddp213:
        def __init__(self, module, forward_sync_buffers=True, broadcast_buffers=True): ...

    class Ddp212:
        def __init__(self, module, broadcast_buffers=True, **kwargs): ...

    assert tf.ddp_buffer_sync(False, Ddp213) == ({"forward_sync_buffers": False}, None)
    kwargs, note = tf.ddp_buffer_sync(False, Ddp212)
    assert kwargs == {"broadcast_buffers": False}
    assert note.startswith(f"note: torch {torch.__version__} has no DDP(forward_sync_buffers=)"), note
    # This torch (2.13, the course's pin) has it.
    if tf.at_least("2.13"):
        assert tf.ddp_buffer_sync(True) == ({"forward_sync_buffers": True}, None)


def test_reduce_scatter_name_follows_the_module():
    assert tf.reduce_scatter_name(types.SimpleNamespace(reduce_scatter_single=1, reduce_scatter_tensor=1)) == (
        "reduce_scatter_single"
    )
    assert tf.reduce_scatter_name(types.SimpleNamespace(reduce_scatter_tensor=1)) == "reduce_scatter_tensor"


def test_accepts_keyword():
    def f(a, b=1): ...

    def g(a, **kwargs): ...

    assert tf.accepts_keyword(f, "b") and not tf.accepts_keyword(f, "c") and tf.accepts_keyword(g, "c")
    assert not tf.accepts_keyword(len, "x") or True  # a builtin without a signature: no error


def test_c11c_counts_the_reduce_scatter_this_torch_calls(monkeypatch):
    """c11c's counter wraps reduce_scatter_single on 2.13 and reduce_scatter_tensor before: on a
    torch without the new name it neither fails nor counts zero."""
    c11c = load_script("c11c_accumulation.py")
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "reduce_scatter_tensor", lambda *a, **k: calls.append("tensor"), raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    with c11c.CountReduceScatters() as sent:
        dist.reduce_scatter_tensor(None, None)
        dist.reduce_scatter_tensor(None, None)
    assert sent.calls == 2 and calls == ["tensor", "tensor"]
    assert not hasattr(dist, "reduce_scatter_single")  # put back as it was
    monkeypatch.setattr(dist, "reduce_scatter_single", lambda *a, **k: calls.append("single"), raising=False)
    with c11c.CountReduceScatters() as sent:
        dist.reduce_scatter_single(None, None)
    assert sent.calls == 1 and calls[-1] == "single"


class _FakeFsdp(nn.Linear):
    """A module with FSDP2's state as torch 2.13 keeps it, or as another torch might."""

    def __init__(self, state):
        super().__init__(2, 2)
        self.state = state

    def _get_fsdp_state(self):
        return self.state


def _param(numel):
    return types.SimpleNamespace(unsharded_accumulated_grad=torch.zeros(numel))


def test_train_gpt_reads_fsdp2s_held_gradients_or_degrades_with_a_note(monkeypatch, capsys):
    train_gpt = load_script("train_gpt.py")
    monkeypatch.setattr(train_gpt, "FSDPModule", _FakeFsdp)
    monkeypatch.setattr(train_gpt.dist, "get_rank", lambda: 0)
    group = types.SimpleNamespace(fsdp_params=[_param(3), _param(5)])
    # 2.13: a list of groups (per-parameter meshes); before: one group, or None.
    assert train_gpt.held_gradient_bytes(_FakeFsdp(types.SimpleNamespace(_fsdp_param_groups=[group]))) == 8 * 4
    assert train_gpt.held_gradient_bytes(_FakeFsdp(types.SimpleNamespace(_fsdp_param_group=group))) == 8 * 4
    assert train_gpt.held_gradient_bytes(_FakeFsdp(types.SimpleNamespace(_fsdp_param_group=None))) == 0
    assert capsys.readouterr().err == ""
    # Internals renamed: only .grad is counted, with one note (once per process).
    model = _FakeFsdp(types.SimpleNamespace())
    model.weight.grad = torch.ones(2, 2)
    assert train_gpt.held_gradient_bytes(model) == 4 * 4
    assert train_gpt.held_gradient_bytes(model) == 4 * 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"note: torch {torch.__version__} has no FSDP2 internals"), err


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
