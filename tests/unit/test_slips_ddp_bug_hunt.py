"""Lab 04's slips: who wrote the checkpoint, and what the logged loss per epoch is of the reference's."""

from parallel_course.slips.ddp_bug_hunt import loss_slip, writers_slip

REFERENCE = [4.59, 0.999, 0.219, 0.084, 0.031]
RANK0 = [4.74, 1.01, 0.216, 0.089, 0.030]


def test_writers():
    assert writers_slip(["rank 0"]) is None
    assert writers_slip(["rank 0", "rank 1"]) == "2 writes, by rank 0, rank 1: does every rank save the checkpoint?"


def test_the_logged_loss():
    assert loss_slip(REFERENCE, REFERENCE, RANK0, 16, 2) is None
    assert "1.0667x the reference's: divided by one batch too few (15, the last batch's index, where there are 16" in (
        loss_slip([x * 16 / 15 for x in REFERENCE], REFERENCE, RANK0, 16, 2)
    )
    assert "2.00x the reference's: is the sum over the ranks divided by the world size?" in loss_slip(
        [2 * x for x in REFERENCE], REFERENCE, RANK0, 16, 2
    )
    assert loss_slip(RANK0, REFERENCE, RANK0, 16, 2) == (
        "these are rank 0's own losses: is the loss averaged over the ranks before it is logged?"
    )
    assert "rank 0's own losses, 1.0667x: averaged over the ranks, and divided by one batch too few" in loss_slip(
        [x * 16 / 15 for x in RANK0], REFERENCE, RANK0, 16, 2
    )
    # one process: its own loss is the job's
    assert loss_slip([3 * x for x in REFERENCE], REFERENCE, REFERENCE, 16, 1) is None
    assert loss_slip([1.0, 2.0, 3.0, 4.0, 5.0], REFERENCE, RANK0, 16, 2) is None
