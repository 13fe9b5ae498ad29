"""DataParallel's steps on threads: same chunks as torch, same result as one full batch."""

import threading

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from parallel_course import data_parallel as dp


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


@pytest.mark.parametrize("batch,n", [(100, 3), (10, 4), (6, 4), (5, 4), (7, 7), (8, 1), (33, 8)])
def test_chunk_sizes_are_torch_chunks(batch, n):
    expected = [len(c) for c in torch.arange(batch).chunk(n)]
    assert dp.chunk_sizes(batch, n) == expected
    assert sum(expected) == batch


def test_chunk_sizes_examples():
    assert dp.chunk_sizes(100, 3) == [34, 34, 32]  # not tensor_split's [34, 33, 33]
    assert dp.chunk_sizes(10, 4) == [3, 3, 3, 1]
    assert dp.chunk_sizes(6, 4) == [2, 2, 2]  # fewer chunks than devices


def test_batch_smaller_than_replicas_is_rejected():
    with pytest.raises(ValueError, match="smaller than the 4 replicas"):
        dp.chunk_sizes(3, 4)
    with pytest.raises(ValueError, match="smaller than"):
        dp.scatter(torch.zeros(2, 3), 3)


@pytest.mark.parametrize("n", [0, -1])
def test_world_size_below_one_is_rejected(n):
    with pytest.raises(ValueError, match="at least 1"):
        dp.cpu_devices(n)
    with pytest.raises(ValueError, match="at least 1"):
        dp.chunk_sizes(10, n)
    with pytest.raises(ValueError, match="at least 1"):
        dp.check_devices([])


@pytest.mark.parametrize("device", ["tpu:0", "gpu0", "cpu", f"cuda:{torch.cuda.device_count()}"])
def test_unknown_device_is_rejected(device):
    with pytest.raises(ValueError, match="unknown device"):
        dp.check_devices(["cpu:0", device])


def test_duplicate_device_is_rejected():
    with pytest.raises(ValueError, match="only once"):
        dp.check_devices(["cpu:0", "cpu:0"])


def test_error_messages_are_one_line():
    for call in (lambda: dp.chunk_sizes(1, 2), lambda: dp.cpu_devices(0), lambda: dp.check_devices(["tpu:0"])):
        with pytest.raises(ValueError) as info:
            call()
        assert "\n" not in str(info.value)


def test_scatter_uses_only_as_many_devices_as_chunks():
    chunks = dp.scatter(torch.arange(6.0).reshape(6, 1), dp.cpu_devices(4))
    assert [len(c) for c in chunks] == [2, 2, 2]
    assert torch.equal(torch.cat(chunks), torch.arange(6.0).reshape(6, 1))


def test_replicas_are_independent_copies_without_grads():
    model = small_model()
    model(torch.randn(4, 10)).sum().backward()
    replicas = dp.replicate(model, 2)
    assert len(replicas) == 2 and all(r is not model for r in replicas)
    for r in replicas:
        for p, q in zip(r.parameters(), model.parameters()):
            assert torch.equal(p, q) and p.data_ptr() != q.data_ptr() and p.grad is None


def test_parallel_apply_runs_one_thread_per_device():
    model = small_model()
    names = []
    model.register_forward_hook(lambda m, i, o: names.append(threading.current_thread().name))
    devices = dp.cpu_devices(3)
    chunks = dp.scatter(torch.randn(9, 10), devices)
    outputs = dp.parallel_apply(dp.replicate(model, devices), chunks, devices)
    assert [o.shape for o in outputs] == [torch.Size([3, 5])] * 3
    assert sorted(names) == ["replica on cpu:0", "replica on cpu:1", "replica on cpu:2"]


def test_parallel_apply_keeps_grad_mode_and_reraises():
    model = small_model()
    devices = dp.cpu_devices(2)
    chunks = dp.scatter(torch.randn(4, 10), devices)
    with torch.no_grad():
        outputs = dp.parallel_apply(dp.replicate(model, devices), chunks, devices)
    assert not any(o.requires_grad for o in outputs)
    bad = [torch.randn(2, 3), torch.randn(2, 3)]  # wrong feature size
    with pytest.raises(RuntimeError, match="replica on cpu:0 failed"):
        dp.parallel_apply(dp.replicate(model, devices), bad, devices)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_step_equals_full_batch(n):
    model = small_model()
    x, y = torch.randn(100, 10), torch.randn(100, 5)
    out_ref, loss_ref, grads_ref = dp.full_batch_step(model, x, y, F.mse_loss)
    assert all(p.grad is None for p in model.parameters())  # reference leaves model alone
    result = dp.data_parallel_step(model, x, y, F.mse_loss, n)
    assert result.chunk_sizes == dp.chunk_sizes(100, n)
    torch.testing.assert_close(result.outputs, out_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(result.loss, loss_ref, atol=1e-6, rtol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_ref[name], atol=1e-6, rtol=0)


def test_reduce_gradients_accumulates_like_backward():
    model = small_model()
    x, y = torch.randn(12, 10), torch.randn(12, 5)
    dp.data_parallel_step(model, x, y, F.mse_loss, 3)
    once = [p.grad.clone() for p in model.parameters()]
    dp.data_parallel_step(model, x, y, F.mse_loss, 3)
    for p, g in zip(model.parameters(), once):
        torch.testing.assert_close(p.grad, 2 * g)


def test_time_phases_reports_every_phase():
    model = small_model()
    times = dp.time_phases(model, torch.randn(12, 10), torch.randn(12, 5), F.mse_loss, 2, repeats=1)
    assert set(times) == {*dp.PHASES, "full batch"} and all(t > 0 for t in times.values())
    overhead, compute = dp.overhead_and_compute(times)
    assert overhead > 0 and compute > 0
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="repeats"):
        dp.time_phases(model, torch.randn(4, 10), torch.randn(4, 5), F.mse_loss, 2, repeats=0)


@pytest.mark.parametrize("seconds,text", [(85e-6, "0.09 ms"), (0.0123, "12.30 ms"), (1.5, "1500.00 ms")])
def test_format_ms(seconds, text):
    assert dp.format_ms(seconds) == text
