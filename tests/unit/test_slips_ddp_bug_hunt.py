"""Lab 04's slips where no injected slip reaches them: one writer, and logged losses per epoch that
are right, of one process, or off in a way no slip explains, name nothing. The slips the check
names for the solution with each slip injected: tests/launches/test_slips_lab04.py."""

from parallel_course.slips.ddp_bug_hunt import loss_slip, writers_slip

REFERENCE = [4.59, 0.999, 0.219, 0.084, 0.031]
RANK0 = [4.74, 1.01, 0.216, 0.089, 0.030]


def test_one_writer_names_nothing():
    assert writers_slip(["rank 0"]) is None


def test_a_logged_loss_without_a_slip():
    assert loss_slip(REFERENCE, REFERENCE, RANK0, 16, 2) is None
    # one process: its own loss is the job's
    assert loss_slip([3 * x for x in REFERENCE], REFERENCE, REFERENCE, 16, 1) is None
    assert loss_slip([1.0, 2.0, 3.0, 4.0, 5.0], REFERENCE, RANK0, 16, 2) is None
