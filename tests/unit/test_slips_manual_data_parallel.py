"""Lab 02's slips, each recognised from what it leaves behind, and none from a right result. The
slips the checks name for the solution with each slip injected: tests/course/test_slips_lab02.py;
here chiefly what those leave out (right results, results no slip explains, a slot left unwritten
in the middle, a replica and a model both without gradients)."""

import torch
from torch import nn

from parallel_course.slips.manual_data_parallel import no_gradient_slip, scale_slip, thread_slip, unwritten_slots


def test_slots_left_unwritten():
    loss = torch.tensor(1.0)
    assert unwritten_slots([loss, loss, loss]) is None
    # (only the last slot written: the injected late binding)
    assert unwritten_slots([loss, None, loss]).startswith("slots [1] hold None: did every thread write its slot")
    assert unwritten_slots("not a list") is None


def test_a_replica_without_gradients():
    # (the model run in the replica's place, its gradient where the replica's should be: the injected slip)
    model, replica = nn.Linear(2, 1), nn.Linear(2, 1)
    assert "does each thread run the backward" in no_gradient_slip(replica, model)
    replica(torch.ones(1, 2)).sum().backward()
    assert no_gradient_slip(replica, model) is None


def test_threads_that_ran_what_they_should_name_nothing():
    assert thread_slip(3, 3, 3) is None
    assert thread_slip(2, 2, 3) is None


def test_a_scale_that_is_no_slip_names_nothing():
    expected = torch.tensor([0.5, -1.0])
    assert scale_slip(expected, expected, [34, 34, 32]) is None
    assert scale_slip(3 * expected, expected, [34, 34, 32]) is None
    assert scale_slip(None, expected, [34, 34, 32]) is None
