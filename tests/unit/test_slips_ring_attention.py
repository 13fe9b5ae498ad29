"""Lab 13's slip recognisers (parallel_course.slips.ring_attention): merge's wrong results named, the
ring's records (of 3 and 4 ranks) read, and silence on what is right; here the slips no injection
makes. The launched checker with each slip injected: tests/launches/test_slips_lab13.py; the
in-kernel merge check: tests/course/test_slips_lab13_merge.py."""

import math

import pytest
import torch

from lab_injection import script
from parallel_course.checks import CheckFailed
from parallel_course.slips.ring_attention import block_of, check_merge, merge_slip, ring_slip, rule


def attention(q, k, v):
    """Attention of q to all of k by its definition: (out, lse)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


@pytest.fixture
def blocks():
    """Two partial results over 4 and 5 keys, and the result over all 9."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 3, 4, generator=generator), *(torch.randn(2, 9, 4, generator=generator) for _ in "kv")
    # Block a's scores higher: the two weigh differently.
    k[:, :4] += 0.7
    parts = [*attention(q, k[:, :4], v[:, :4]), *attention(q, k[:, 4:], v[:, 4:])]
    return parts, attention(q, k, v)


def test_a_right_merge_names_no_slip(blocks):
    parts, whole = blocks
    assert merge_slip(whole, parts) is None


def test_the_wrong_merges_no_injection_makes_are_named(blocks):
    # (the outputs averaged, added, not divided by their sum, swapped; lse_a kept, the larger one, exp
    # overflowed: the injected slips)
    (out_a, lse_a, out_b, lse_b), (out, lse) = blocks
    cases = {"lse_b unchanged": (out, lse_b), "lse_a + lse_b": (out, lse_a + lse_b)}
    for named, got in cases.items():
        slip = merge_slip(got, (out_a, lse_a, out_b, lse_b))
        assert slip is not None and named in slip, (named, slip)


def test_the_check_passes_the_solutions_merge_and_fails_a_wrong_return(capsys):
    scope = {}
    exec(script("lab13_ring_attention.ipynb", "lab13_ring.py"), scope)
    check_merge(scope["merge"])
    assert capsys.readouterr().out.count("PASS") == 4
    with pytest.raises(CheckFailed, match="expected a tuple \\(out, lse\\) of two tensors, got Tensor"):
        check_merge(lambda out_a, lse_a, out_b, lse_b: out_a)


def test_the_rule_and_blocks_found_by_their_values():
    assert [rule(2, j) for j in range(4)] == ["full", "full", "causal", "skip"]
    chunks = torch.arange(12.0).reshape(3, 4).unbind()
    assert block_of(chunks[1].clone(), chunks) == 1
    assert block_of(chunks[1] + 1, chunks) is None


def events(n, rank, direction=1, shift=0, own=True, earlier=False, later=None, steps=None):
    """What ``traced`` records on ``rank`` for a ring loop: blocks arriving from the left (direction 1)
    or the right (-1), each treated as the block the loop believes it is, (rank - step + shift) % n:
    ``own`` causal flag at step 0 (None: not attended), ``earlier`` and ``later`` flags (None: skipped)."""
    found = [] if own is None else [("attend", rank, own)]
    for step in range(1, n if steps is None else steps + 1):
        block, believed = (rank - direction * step) % n, (rank - step + shift) % n
        found.append(("receive", block))
        causal = None if believed == rank else earlier if believed < rank else later
        if causal is not None:
            found += [("attend", block, causal), ("merge", None, True)]
    return found


def traces(n, **how):
    return [events(n, rank, **how) for rank in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_right_ring_names_no_slip(n):
    assert ring_slip(traces(n)) is None


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize(
    "how, named",
    # (the rotation off by one, the own block in full, an earlier one causal, a later one in full: the
    # injected slips; K/V sent the wrong way round are found on threads before the records are read)
    [
        (dict(direction=-1), "K/V travel the wrong way round"),
        (dict(own=None), "attended to its own block not at all"),
        (dict(earlier=None), "an earlier one, not at all"),
        (dict(later=True), "a later one (causal mask)"),
        (dict(steps=1), "ring_step was called 1 time(s) on a rank"),
    ],
)
def test_each_ring_slip_no_injection_makes_is_named(n, how, named):
    slip = ring_slip(traces(n, **how))
    assert slip is not None and named in slip, slip
