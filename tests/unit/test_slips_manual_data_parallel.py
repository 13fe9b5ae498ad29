"""Lab 02's slips, each recognised from what it leaves behind, and none from a right result."""

import torch
from torch import nn

from parallel_course.slips.manual_data_parallel import no_gradient_slip, scale_slip, thread_slip, unwritten_slots


def test_slots_left_unwritten():
    loss = torch.tensor(1.0)
    assert unwritten_slots([loss, loss, loss]) is None
    assert "only the last slot (2) was written: did every thread run the last replica" in unwritten_slots(
        [None, None, loss]
    )
    assert unwritten_slots([loss, None, loss]).startswith("slots [1] hold None: did every thread write its slot")
    assert unwritten_slots("not a list") is None


def test_a_replica_without_gradients():
    model, replica = nn.Linear(2, 1), nn.Linear(2, 1)
    assert "does each thread run the backward" in no_gradient_slip(replica, model)
    model(torch.ones(1, 2)).sum().backward()
    assert "does the thread run the model, not its replica?" in no_gradient_slip(replica, model)
    replica(torch.ones(1, 2)).sum().backward()
    assert no_gradient_slip(replica, model) is None


def test_which_thread_ran_what():
    assert thread_slip(3, 3, 3) is None
    assert "does loss.backward() run after the threads are joined?" in thread_slip(3, 0, 3)
    assert "every replica ran on the calling thread" in thread_slip(0, 0, 3)
    assert thread_slip(2, 2, 3) is None


def test_off_by_the_samples_or_the_samples_per_chunk():
    expected = torch.tensor([0.5, -1.0])
    assert "100.00x the expected, the number of samples" in scale_slip(100 * expected, expected, [34, 34, 32])
    assert "33.33x the expected, 100/3: divided by the number of chunks" in scale_slip(
        100 / 3 * expected, expected, [34, 34, 32]
    )
    assert scale_slip(expected, expected, [34, 34, 32]) is None
    assert scale_slip(3 * expected, expected, [34, 34, 32]) is None
    assert scale_slip(None, expected, [34, 34, 32]) is None
