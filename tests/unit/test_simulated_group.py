"""The process group simulated on threads (``parallel_course.slips.simulated_group``): sends matched with
receives in order, a correct ring never taken for a deadlock however the threads run, a deadlock and
a rank that returns early found with who waits for whom, a receive into a tensor still being sent; and
collectives on subgroups (lab 15): sums, a rank that skips one, members that call different ones."""

import torch
import torch.distributed as dist

from parallel_course.slips.simulated_group import Subgroup, simulate


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


# --- collectives (lab 15) -----------------------------------------------------------------------

PAIRS = [Subgroup((0, 1), "tp"), Subgroup((2, 3), "tp")]
COLUMNS = [Subgroup((0, 2), "pp"), Subgroup((1, 3), "pp")]


def values(n):
    return [(torch.tensor([float(rank + 1)]),) for rank in range(n)]


def test_all_reduce_sums_over_each_subgroup_and_the_group_answers_for_it():
    def twice(t):
        rank = dist.get_rank()
        dist.all_reduce(t, group=PAIRS[rank // 2])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=COLUMNS[rank % 2])
        return t.item(), dist.get_rank(PAIRS[rank // 2]), dist.get_world_size(COLUMNS[rank % 2])

    for _ in range(10):
        outcome = simulate(twice, values(4), collectives=("all_reduce",))
        assert outcome.deadlock is None and outcome.error is None
        # pairs: 1+2, 3+4; then the larger of each column
        assert outcome.results == [(7.0, 0, 2), (7.0, 1, 2), (7.0, 0, 2), (7.0, 1, 2)]
        assert sorted((c.kind, c.ranks, c.numel) for c in outcome.collectives) == [
            ("all_reduce", (0, 1), 1),
            ("all_reduce", (0, 2), 1),
            ("all_reduce", (1, 3), 1),
            ("all_reduce", (2, 3), 1),
        ]
    assert dist.all_reduce.__module__.startswith("torch")


def test_the_other_collectives():
    def gather(t):
        parts = [torch.empty_like(t) for _ in range(4)]
        dist.all_gather(parts, t)
        whole = torch.empty(4)
        dist.all_gather_into_tensor(whole, t)
        dist.broadcast(t, src=3)
        work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
        work.wait()
        dist.barrier()
        return torch.cat(parts).tolist(), whole.tolist(), t.item()

    outcome = simulate(
        gather, values(4), collectives=("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "barrier")
    )
    assert outcome.results == [([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], 4.0)] * 4


def test_a_rank_that_skips_a_collective_leaves_its_group_waiting():
    def rank_3_skips(t):
        if dist.get_rank() != 3:
            dist.all_reduce(t, group=PAIRS[dist.get_rank() // 2])
            dist.all_reduce(t)

    outcome = simulate(rank_3_skips, values(4), collectives=("all_reduce",))
    assert outcome.deadlock == [
        "rank 0 waits in its all_reduce #1 on ranks [0, 1, 2, 3], which rank(s) [2, 3] never called",
        "rank 1 waits in its all_reduce #1 on ranks [0, 1, 2, 3], which rank(s) [2, 3] never called",
        "rank 2 waits in its all_reduce #1 on ranks [2, 3], which rank(s) [3] never called",
        "rank 3 returned after 0 collective call(s)",
    ]


def test_members_calling_different_collectives_stop_the_group():
    def rank_1_differs(t):
        dist.all_reduce(torch.zeros(3) if dist.get_rank() == 1 else t, group=PAIRS[0])

    outcome = simulate(rank_1_differs, values(2), collectives=("all_reduce",))
    assert outcome.mismatch == ["rank 0 calls all_reduce of 1 element(s)", "rank 1 calls all_reduce of 3 element(s)"]
    # A collective that is not simulated still raises.
    assert simulate(lambda t: dist.all_to_all_single(t, t), values(2), collectives=("all_reduce",)).forbidden[1] == (
        "all_to_all_single"
    )
