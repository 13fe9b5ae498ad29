"""Lab 15's layout (``parallel_course.slips.norm_layout``) and recognisers (``parallel_course.slips.global_norm``):
who holds what, the gradients the checks hand out, each slip read from results made by hand (per-rank
norms, per-piece factors, which ranks stepped), silence on right ones, and the two ways the student's code
is run (a group of one that keeps nothing from call to call; elements counted on real collectives). The
check cells with slips injected: tests/course/test_slips_lab15_checks.py."""

import math

import pytest
import torch
import torch.distributed as dist

from lab_injection import script
from parallel_course.slips.global_norm import (
    LOCAL,
    OWN_EXPERTS,
    SHARDS,
    SQUARED,
    STAGES,
    NotInThisLab,
    Run,
    clip_slip,
    counted_collectives,
    local_norms,
    nonfinite_slip,
    one_rank,
    reading,
    simulated_problem,
    simulated_run,
    step_slip,
)
from parallel_course.slips.norm_layout import (
    LAB,
    ONE,
    Sizes,
    clip_cases,
    describe_layout,
    expert_owner,
    pieces_of,
    placement,
    probes,
    sizes_for,
    step_gradient,
)

SMALL = Sizes(1, 2, 2)


@pytest.mark.parametrize("sizes", [ONE, SMALL, LAB])
def test_ranks_coordinates_and_groups(sizes):
    for rank in range(sizes.world):
        here = sizes.coords(rank)
        assert sizes.rank_of(**here) == rank
        for axis in ("dp", "tp", "pp"):
            group = sizes.group(rank, axis)
            assert len(group) == getattr(sizes, axis) and rank in group
            assert all(sizes.coords(other)[a] == here[a] for other in group for a in ("dp", "tp", "pp") if a != axis)


def test_the_launched_checker_takes_a_layout_for_every_world_size():
    assert [tuple(sizes_for(n)) for n in range(1, 9)] == [
        (1, 1, 1),
        (1, 2, 1),
        (3, 1, 1),
        (1, 2, 2),
        (5, 1, 1),
        (3, 2, 1),
        (7, 1, 1),
        (2, 2, 2),
    ]


@pytest.mark.parametrize("sizes", [ONE, SMALL, LAB, Sizes(5, 1, 1)])
def test_the_pieces_make_the_whole_gradient_each_part_held_as_the_layout_says(sizes):
    grads, _ = step_gradient()
    held = [pieces_of(grads, sizes, rank) for rank in range(sizes.world)]
    storages = [p.grad.untyped_storage().data_ptr() for pieces in held for p in pieces]
    assert len(set(storages)) == len(storages), "two ranks share a piece's tensor"
    for name, whole in grads.items():
        kind, dim, expert = placement(name)
        holders = {rank: p for rank, pieces in enumerate(held) for p in pieces if p.name == name}
        assert all(p.kind == kind for p in holders.values())
        if kind == "expert":
            dp = expert_owner(expert, sizes)
            assert {sizes.coords(r)["dp"] for r in holders} == {dp} and len(holders) == sizes.tp
        else:
            assert len(holders) == sizes.dp * sizes.tp
        for rank, piece in holders.items():
            if kind == "tp_split":
                pieces = [holders[other].grad for other in sizes.group(rank, "tp")]
                assert torch.equal(torch.cat(pieces, dim=dim), whole)
            else:
                assert torch.equal(piece.grad, whole)


def test_the_layout_printed():
    lines = describe_layout().splitlines()
    assert lines[0] == "12 ranks (dp 3 × tp 2 × pp 2): rank = (dp · 2 + pp) · 2 + tp"
    assert any(line.split()[:3] == ["fc2.weight", "(8,", "16)"] and "columns" in line for line in lines)
    assert lines[-3:] == [
        "dp 0    ranks 0, 1            ranks 2, 3            0-1",
        "dp 1    ranks 4, 5            ranks 6, 7            2-3",
        "dp 2    ranks 8, 9            ranks 10, 11          4-5",
    ]


def test_each_probe_holds_the_norm_it_expects_and_the_step_is_torchs():
    grads, norm = step_gradient()
    total = math.sqrt(sum(g.double().pow(2).sum().item() for g in grads.values()))
    assert norm == pytest.approx(total, rel=1e-6)
    found = probes(LAB)
    assert len(found) == 8 and {len(p.parts) for p in found} == {1, 2}
    for probe in found:
        got = math.sqrt(sum(g.double().pow(2).sum().item() for g in probe.grads.values()))
        assert got == pytest.approx(probe.expected), probe.what
    assert len(probes(SMALL)) == 7, "the dp pair needs two dp ranks"


def per_rank(sizes, value):
    """A value for every rank of ``sizes``, from its coordinates."""
    return [value(**sizes.coords(rank)) for rank in range(sizes.world)]


def test_a_probe_read_right_names_no_slip():
    for probe in probes(LAB):
        assert reading(probe, [probe.expected] * LAB.world, LAB) is None


@pytest.mark.parametrize(
    "probe, value, named",
    [
        # A split tensor, 3 in tp rank 0's piece, stage 0.
        (0, lambda dp, tp, pp: 3.0 if pp == 0 else 0.0, STAGES),
        (0, lambda dp, tp, pp: 3.0 if tp == 0 else 0.0, SHARDS),
        (0, lambda dp, tp, pp: 3 * math.sqrt(3), "replicated parameters counted 3 times: the 3 dp ranks"),
        (0, lambda dp, tp, pp: 9.0, SQUARED),
        (0, lambda dp, tp, pp: 3 / math.sqrt(2), "averaged where it should add: a sum of squares reduced with"),
        (0, lambda dp, tp, pp: 3 * 1.1, "the norm of this gradient is 1.100 × the expected"),
        # A replicated tensor, 3 on every copy.
        (
            1,
            lambda dp, tp, pp: 3 * math.sqrt(2),
            "counted 2 times: a tp_replicated tensor is the same on each of the 2 tp",
        ),
        (1, lambda dp, tp, pp: 3 * math.sqrt(3), "the same on each of the 3 dp ranks of its stage"),
        (1, lambda dp, tp, pp: 3 * math.sqrt(6), "the same on each of the 3 dp × 2 tp ranks of its stage"),
        # One expert, on dp rank 0.
        (2, lambda dp, tp, pp: 3.0 if dp == 0 else 0.0, OWN_EXPERTS),
        (2, lambda dp, tp, pp: 3 * math.sqrt(2), "on the 2 tp ranks that hold a copy of it"),
        (2, lambda dp, tp, pp: 6.0, "experts counted on every rank: each expert was counted 4 times"),
        # Two parts, 3 and 4: across tp, across the stages.
        (3, lambda dp, tp, pp: 7.0, "norms added instead of their squares, across the tp ranks: 3 + 4 = 7"),
        (4, lambda dp, tp, pp: 7.0, "across the stages: 3 + 4 = 7, not √(3² + 4²) = 5"),
    ],
)
def test_each_way_of_counting_is_named(probe, value, named):
    found = reading(probes(LAB)[probe], per_rank(LAB, value), LAB)
    assert found is not None and named in found, found


def solution_module():
    scope = {"__name__": "lab15_norm"}
    exec(script("lab15_global_norm.ipynb", "lab15_norm.py"), scope)
    return type("Module", (), scope)


def test_the_step_read_as_a_ranks_own_norm_first():
    grads, _ = step_gradient()
    own = simulated_run(lambda pieces, layout: None, grads, LAB)
    values = local_norms(own.pieces)
    assert step_slip(solution_module().global_norm, LAB, lambda *a: pytest.fail("no probe needed"), values, own) == (
        LOCAL
    )


def test_a_group_of_one_keeps_nothing_from_one_call_to_the_next():
    t = torch.tensor([2.0])
    with one_rank():
        with pytest.raises(NotInThisLab):
            dist.send(t, 1)
        dist.all_reduce(t)
        parts = [torch.zeros(1)]
        dist.all_gather(parts, t)
        assert dist.all_reduce(t, async_op=True).wait() and parts[0].item() == t.item() == 2.0
        with pytest.raises(ValueError, match="group= must be one of this rank's groups"):
            dist.all_reduce(t, group="tp")
    assert dist.all_reduce.__module__.startswith("torch")


def test_the_elements_given_to_collectives_are_counted(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None, group=None, async_op=False: calls.append(tensor))
    monkeypatch.setattr(dist, "all_gather", lambda tensor_list, tensor, group=None, async_op=False: None)
    with counted_collectives() as elements:
        dist.all_reduce(torch.zeros(3), group=None)
        dist.all_reduce(tensor=torch.zeros(()))
        dist.all_gather([torch.zeros(5)] * 2, torch.zeros(5))
    assert elements == [3, 1, 5] and len(calls) == 2
    assert dist.all_gather.__name__ == "<lambda>", "the collectives as they were before"


def clipped(case, sizes, factor):
    """Every rank's pieces of ``case`` after scaling, rank r's piece by factor(rank, piece)."""
    held = [pieces_of(case.grads, sizes, rank) for rank in range(sizes.world)]
    for rank, pieces in enumerate(held):
        for piece in pieces:
            piece.grad = piece.grad * factor(rank, piece)
    return Run(pieces=held)


def test_each_clipping_slip_is_named_from_the_factors():
    above, below, *_ = clip_cases(LAB)
    norm = step_gradient()[1]
    local = local_norms([pieces_of(above.grads, LAB, rank) for rank in range(LAB.world)])
    right = above.max_norm / (norm + 1e-6)
    cases = {
        "clipped with each rank's local norm": (above, lambda r, p: min(1.0, above.max_norm / (local[r] + 1e-6))),
        "the gradients were not changed": (above, lambda r, p: 1.0),
        "its tp_replicated pieces off": (
            above,
            lambda r, p: 1.0 if p.kind == "tp_replicated" and LAB.coords(r)["tp"] == 1 else right,
        ),
        "the gradients grew ×2 = max_norm / norm": (below, lambda r, p: below.max_norm / (norm + 1e-6)),
        "the coefficient uses a norm 1.41 × the global one": (above, lambda r, p: right / math.sqrt(2)),
    }
    for named, (case, factor) in cases.items():
        found = clip_slip(case, LAB, clipped(case, LAB, factor))
        assert found is not None and named in found, (named, found)


def test_ranks_that_step_on_a_non_finite_gradient_are_named():
    for case in clip_cases(LAB)[2:]:
        result = Run(pieces=[pieces_of(case.grads, LAB, rank) for rank in range(LAB.world)])
        holders = [r for r, pieces in enumerate(result.pieces) if any(not torch.isfinite(p.grad).all() for p in pieces)]
        assert holders and len(holders) < LAB.world
        assert nonfinite_slip([False] * LAB.world, case, LAB, result) is None
        own = [rank not in holders for rank in range(LAB.world)]
        assert "each rank tested its own gradients" in nonfinite_slip(own, case, LAB, result)
        assert "a non-finite norm not skipped" in nonfinite_slip([True] * LAB.world, case, LAB, result)


def test_the_threads_first_find_a_rank_that_leaves_and_pass_the_solution():
    module = solution_module()
    assert simulated_problem(module, SMALL) is None

    def leaves(pieces, layout, max_norm):
        if not all(torch.isfinite(p.grad).all() for p in pieces):
            return False
        return module.clip_(pieces, layout, max_norm)

    class Leaving:
        global_norm, clip_ = module.global_norm, staticmethod(leaves)

    found = simulated_problem(Leaving, SMALL)
    assert found.startswith("clip_, an inf in expert 5 (held by dp rank 0): the ranks wait forever (rank 2 returned"), (
        found
    )
