"""parallel_course.data_parallel_figures: what chapter 02's figure puts where, from one re-enacted
DataParallel step."""

import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.patches import FancyBboxPatch

from parallel_course import data_parallel as dp
from parallel_course.data_parallel_figures import (
    data_parallel_step_figure,
    data_parallel_step_picture,
    describe_data_parallel_step,
)


@pytest.fixture
def step():
    """One step of chapter 02's re-enactment on 3 CPU devices, with the hook that records threads."""
    torch.manual_seed(0)
    devices = dp.cpu_devices(3)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    inputs, targets = torch.randn(10, 10), torch.randn(10, 5)
    chunks = dp.scatter(inputs, devices)
    replicas = dp.replicate(model, devices)
    ran_on = []
    for r in replicas:
        r.register_forward_hook(lambda m, a, o: ran_on.append(threading.current_thread().name))
    replica_outputs = dp.parallel_apply(replicas, chunks, devices)
    outputs = dp.gather(replica_outputs, devices[0])
    F.mse_loss(outputs, targets).backward()
    dp.reduce_gradients(model, replicas)
    return dict(
        devices=devices,
        inputs=inputs,
        chunks=chunks,
        model=model,
        replicas=replicas,
        ran_on=ran_on,
        replica_outputs=replica_outputs,
        outputs=outputs,
    )


def test_the_step_picture_holds_each_devices_chunk_replica_thread_and_gradient(step):
    picture = data_parallel_step_picture(**step)
    assert picture.chunk_shapes == [(4, 10), (4, 10), (2, 10)]
    assert picture.output_shapes == [(4, 5), (4, 5), (2, 5)]
    assert picture.threads == ["replica on cpu:0", "replica on cpu:1", "replica on cpu:2"]
    assert picture.replica_parameters == [325] * 3 and picture.separate_copies == [True] * 3
    assert (picture.batch_shape, picture.gathered_shape, picture.gathered_device) == ((10, 10), (10, 5), "cpu:0")
    assert picture.parameter == "0.weight"
    assert picture.replica_grad_norms == [r[0].weight.grad.norm().item() for r in step["replicas"]]
    assert picture.summed_grad_norm == step["model"][0].weight.grad.norm().item()


def test_the_step_picture_refuses_a_record_that_does_not_hold_together(step):
    with pytest.raises(ValueError, match="ran 0 times"):
        data_parallel_step_picture(**dict(step, ran_on=step["ran_on"][:2]))
    with pytest.raises(ValueError, match="3 devices, 2 chunks"):
        data_parallel_step_picture(**dict(step, chunks=step["chunks"][:2]))
    # A gradient that is not the replicas' sum (reduce_gradients run twice: twice the sum).
    dp.reduce_gradients(step["model"], step["replicas"])
    with pytest.raises(ValueError, match="not the sum"):
        data_parallel_step_picture(**step)


def test_the_step_figure_draws_a_box_per_device_per_phase_and_says_what_it_shows(step):
    picture = data_parallel_step_picture(**step)
    fig = data_parallel_step_figure(picture)
    (ax,) = fig.get_axes()
    # Per device: chunk, replica, thread, replica grad; once: batch, model, gathered outputs, summed grad.
    assert sum(isinstance(p, FancyBboxPatch) for p in ax.patches) == 4 * 3 + 4
    texts = [t.get_text() for t in ax.texts]
    assert "chunk (2, 10)" in texts
    assert "thread\n'replica on cpu:2'\nout (2, 5)" in texts
    alt = describe_data_parallel_step(picture)
    assert "cpu:2: chunk (2, 10), a replica of 325 parameters (its own copy) run by thread 'replica on cpu:2'" in alt
    assert "gathered into (10, 5) on cpu:0" in alt
