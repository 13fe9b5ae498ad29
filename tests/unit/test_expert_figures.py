"""parallel_course.expert_figures (chapter 13b): each expert's slots as gpt.route fills them."""

import pytest
import torch

from parallel_course import expert_figures as ef
from parallel_course.gpt import expert_capacity, route

# Chapter 13b's example: six tokens, three experts, top-2, capacity factor 1.
PROBS = torch.tensor(
    [[0.6, 0.3, 0.1], [0.5, 0.1, 0.4], [0.7, 0.2, 0.1], [0.4, 0.5, 0.1], [0.6, 0.1, 0.3], [0.5, 0.3, 0.2]]
)


def buffers_of(probs, top_k, capacity_factor):
    tokens, n_experts = probs.shape
    capacity = expert_capacity(tokens, n_experts, top_k, capacity_factor)
    experts, gates, slots, kept = route(probs, top_k, capacity)
    return ef.expert_slots(experts, gates, slots, kept, n_experts), capacity


def test_every_choice_is_drawn_once_in_its_experts_row_at_its_slot():
    buffers, capacity = buffers_of(PROBS, 2, 1.0)
    assert capacity == 4
    assert [len(b) for b in buffers] == [6, 4, 2]
    assert sorted((s.token, s.choice) for b in buffers for s in b) == [(t, j) for t in range(6) for j in (1, 2)]
    assert [s.slot for s in buffers[0]] == [0, 1, 2, 3, 4, 5]
    assert [(s.token, s.choice) for s in buffers[0]] == [(0, 1), (1, 1), (2, 1), (4, 1), (5, 1), (3, 2)]


def test_the_choices_past_capacity_are_the_dropped_ones():
    buffers, capacity = buffers_of(PROBS, 2, 1.0)
    dropped = [(e, s.token, s.choice) for e, b in enumerate(buffers) for s in b if not s.kept]
    assert dropped == [(0, 5, 1), (0, 3, 2)]
    assert all((s.slot < capacity) == s.kept for b in buffers for s in b)
    alt = ef.describe_expert_slots(buffers, capacity)
    assert "dropped: token 5 (1st choice), token 3 (2nd choice)" in alt
    assert "Expert 2: slot 0: token 1 (2nd choice), slot 1: token 4 (2nd choice); 2 empty slots." in alt
    # With room for every choice nothing is drawn as dropped.
    roomy, _ = buffers_of(PROBS, 2, 1.5)
    assert all(s.kept for b in roomy for s in b)


def test_figure_has_a_box_per_choice_and_per_empty_slot():
    buffers, capacity = buffers_of(PROBS, 2, 1.0)
    fig = ef.expert_slots_figure(buffers, capacity, top_k=2)
    (ax,) = fig.axes
    # 12 choices and 2 empty slots of expert 2.
    assert len(ax.patches) == 12 + 2


def test_the_all_to_all_blocks_hold_the_tokens_routed_to_each_ranks_experts():
    # Two ranks of two tokens each, 4 experts (rank 0 holds 0 and 1, rank 1 holds 2 and 3), top-2.
    rank0 = (torch.tensor([[0, 2], [1, 3]]), torch.tensor([[True, True], [True, False]]))
    rank1 = (torch.tensor([[3, 2], [3, 0]]), torch.tensor([[True, True], [True, True]]))
    traffic = ef.all_to_all_traffic([rank0, rank1], n_experts=4, capacity=3)
    assert traffic.tokens == [[2, 1], [1, 3]]
    assert traffic.slots == 2 * 3 and traffic.dropped == [1, 0]
    assert traffic.experts == [[0, 1], [2, 3]]
    # Every kept choice is in exactly one block.
    assert sum(map(sum, traffic.tokens)) == int(rank0[1].sum() + rank1[1].sum())
    alt = ef.describe_traffic(traffic, "block 0")
    assert "rank 0 to rank 1: 1; rank 1 to rank 0: 1; rank 1 to rank 1: 3" in alt
    fig = ef.traffic_figure(traffic, "block 0")
    # Per panel and pair: the block and its filled part.
    assert [len(ax.patches) for ax in fig.axes] == [2 * 4, 2 * 4]


def test_experts_must_split_evenly_over_the_ranks():
    with pytest.raises(ValueError, match="do not split evenly"):
        ef.all_to_all_traffic([(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool))] * 3, 4, 1)
