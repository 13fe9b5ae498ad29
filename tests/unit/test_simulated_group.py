"""The process group simulated on threads (``parallel_course.slips.simulated_group``): sends matched with
receives in order, a correct ring never taken for a deadlock however the threads run, a deadlock and
a rank that returns early found with who waits for whom, a receive into a tensor still being sent."""

import torch
import torch.distributed as dist

from parallel_course.slips.simulated_group import simulate


def shift(t):
    """t to the right neighbour, the left one's back: blocking calls ordered by parity."""
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(t)
    if rank % 2 == 0:
        dist.send(t, dst=(rank + 1) % n)
        dist.recv(incoming, src=(rank - 1) % n)
    else:
        dist.recv(incoming, src=(rank - 1) % n)
        dist.send(t, dst=(rank + 1) % n)
    return incoming


def ranks(n):
    return [(torch.full((2,), float(rank)),) for rank in range(n)]


def test_a_ring_passes_on_every_run_and_each_message_is_counted():
    for _ in range(30):
        outcome = simulate(shift, ranks(3), allowed=("send", "recv"))
        assert outcome.deadlock is None and outcome.error is None and all(outcome.returned)
        assert [r.tolist() for r in outcome.results] == [[2.0, 2.0], [0.0, 0.0], [1.0, 1.0]]
        assert sorted((m.src, m.dst, m.numel) for m in outcome.messages) == [(0, 1, 2), (1, 2, 2), (2, 0, 2)]
    # the patched names are torch's again
    assert dist.send.__module__.startswith("torch")


def test_every_rank_sending_first_is_a_deadlock():
    def send_first(t):
        rank, n = dist.get_rank(), dist.get_world_size()
        dist.send(t, dst=(rank + 1) % n)
        dist.recv(torch.empty_like(t), src=(rank - 1) % n)

    outcome = simulate(send_first, ranks(2))
    assert outcome.deadlock == ["rank 0 waits in its send #1 to rank 1", "rank 1 waits in its send #1 to rank 0"]


def test_a_rank_that_returns_early_leaves_its_neighbour_waiting():
    def rank_0_leaves(t):
        if dist.get_rank() > 0:
            return shift(t)

    outcome = simulate(rank_0_leaves, ranks(2))
    assert outcome.deadlock == [
        "rank 0 returned after 0 send(s) and 0 receive(s)",
        "rank 1 waits for its receive #1 from rank 0",
    ]


def test_a_receive_into_the_tensor_being_sent_and_a_collective():
    def in_place(t):
        rank, n = dist.get_rank(), dist.get_world_size()
        ops = [dist.P2POp(dist.isend, t, (rank + 1) % n), dist.P2POp(dist.irecv, t, (rank - 1) % n)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    assert simulate(in_place, ranks(2)).aliased == (0, 1)
    assert simulate(lambda t: dist.all_reduce(t), ranks(2)).forbidden[1] == "all_reduce"
    assert simulate(shift, ranks(2), allowed=("isend",)).forbidden[1] in {"send", "recv"}
