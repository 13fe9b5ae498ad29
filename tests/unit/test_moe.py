"""parallel_course.gpt's mixture of experts: routing, capacity and drops, the load-balancing loss."""

import pytest
import torch
import torch.nn.functional as F

import parallel_course.gpt as gpt
from parallel_course.gpt import GPT, MLP, GPTConfig, MoE, expert_capacity, route


def test_capacity_is_the_average_load_times_the_factor():
    assert expert_capacity(512, 4, 2, 1.0) == 256
    assert expert_capacity(512, 4, 2, 1.25) == 320
    # Rounded up: never fewer slots than the factor asks for.
    assert expert_capacity(10, 4, 1, 1.0) == 3
    # C = E / k: an expert can take every token (a token picks an expert at most once).
    assert expert_capacity(10, 4, 2, 2.0) == 10


def test_route_keeps_the_first_tokens_and_drops_the_rest():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    experts, gates, slots, kept = route(probs, top_k=1, capacity=2)
    assert experts.flatten().tolist() == [0, 0, 1, 0]
    # Gates are the router's probabilities, not renormalised over the chosen experts.
    assert torch.equal(gates.flatten(), torch.tensor([0.9, 0.8, 0.7, 0.6]))
    assert slots.flatten().tolist() == [0, 1, 0, 2]
    assert kept.flatten().tolist() == [True, True, True, False]


def test_every_first_choice_is_served_before_any_second_choice():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.1, 0.7]])
    experts, gates, slots, kept = route(probs, top_k=2, capacity=1)
    assert experts.tolist() == [[0, 1], [1, 2], [2, 0]]
    # Token 0's second choice (expert 1) comes after token 1's first choice of it: dropped.
    assert slots.tolist() == [[0, 1], [0, 1], [0, 1]]
    assert kept.tolist() == [[True, False], [True, False], [True, False]]


def moe(experts=2, top_k=1, capacity_factor=8.0, d_model=8, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(d_model=d_model, mlp_ratio=2, moe_experts=experts, top_k=top_k, capacity_factor=capacity_factor)
    return MoE(cfg)


def by_hand(layer, tokens, capacity):
    """Token by token: the sum of its kept choices' gate x expert output."""
    probs = layer.router(tokens).softmax(-1)
    experts, gates, _, kept = route(probs, layer.cfg.top_k, capacity)
    rows = []
    for t in range(len(tokens)):
        row = torch.zeros(tokens.shape[1])
        for e, g, k in zip(experts[t], gates[t], kept[t]):
            if k:
                row = row + g * layer.experts[int(e)](tokens[t])
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("top_k, capacity_factor", [(1, 8.0), (2, 8.0), (1, 0.5), (2, 0.75)])
def test_moe_equals_its_tokens_computed_one_by_one(top_k, capacity_factor):
    layer = moe(experts=4, top_k=top_k, capacity_factor=capacity_factor)
    x = torch.randn(3, 5, 8)
    y = layer(x)
    capacity = expert_capacity(15, 4, top_k, capacity_factor)
    torch.testing.assert_close(y.reshape(15, 8), by_hand(layer, x.reshape(15, 8), capacity), atol=1e-6, rtol=1e-5)
    assert int(layer.routed.sum()) == 15 * top_k
    # A dropped choice is counted once; a full expert holds exactly its capacity.
    kept = layer.routed - layer.dropped
    assert (kept <= capacity).all() and (layer.dropped[kept < capacity] == 0).all()
    if capacity_factor >= 4 / top_k:
        assert int(layer.dropped.sum()) == 0
    else:
        assert int(layer.dropped.sum()) > 0


def test_a_token_dropped_by_every_expert_gets_zero():
    layer = moe(experts=2, top_k=1, capacity_factor=0.5)
    x = torch.randn(1, 8, 8)
    y = layer(x).reshape(8, 8)
    probs = layer.router(x.reshape(8, 8)).softmax(-1)
    _, _, _, kept = route(probs, 1, expert_capacity(8, 2, 1, 0.5))
    assert (~kept).any()
    assert torch.equal(y[~kept[:, 0]], torch.zeros_like(y[~kept[:, 0]]))


def test_one_expert_top_1_without_drops_is_the_dense_mlp():
    layer = moe(experts=1, top_k=1, capacity_factor=1.0)
    dense = MLP(layer.cfg)
    dense.load_state_dict(layer.experts[0].state_dict())
    x = torch.randn(4, 6, 8)
    torch.testing.assert_close(layer(x), dense(x), atol=1e-6, rtol=1e-6)
    assert int(layer.dropped.sum()) == 0


def test_aux_loss_on_a_hand_example():
    # The router is the identity on 2 features, fed log-probabilities: its softmax gives them back.
    layer = moe(experts=2, top_k=1, d_model=2)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(2))
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    layer(probs.log()[None])
    # f = (3/4, 1/4) of the choices, P = (0.65, 0.35) mean probabilities: 2 x (0.4875 + 0.0875).
    assert layer.routed.tolist() == [3, 1]
    assert layer.aux_loss.item() == pytest.approx(1.15, abs=1e-6)


def test_aux_loss_is_one_when_the_router_is_uniform():
    layer = moe(experts=4, top_k=2)
    with torch.no_grad():
        layer.router.weight.zero_()
    layer(torch.randn(2, 5, 8))
    assert layer.aux_loss.item() == pytest.approx(1.0, abs=1e-6)


def test_shares_of_a_group_sum_to_the_loss_over_all_its_tokens(monkeypatch):
    layer = moe(experts=4, top_k=2)
    x = torch.randn(2, 6, 8)
    layer(x)
    whole = layer.aux_loss.item()
    halves = []
    for part in x:
        layer(part[None])
        halves.append(layer.routed.clone())
    # Two ranks' counts, summed as the all-reduce over their group would.
    shares = []
    for i, part in enumerate(x):
        other = torch.cat([halves[1 - i], torch.zeros(4, dtype=torch.long), torch.tensor([6])])
        monkeypatch.setattr(gpt.dist, "all_reduce", lambda t, group, other=other: t.add_(other))
        layer.group = "both ranks"
        layer(part[None])
        shares.append(layer.aux_loss.item())
    assert sum(shares) == pytest.approx(whole, rel=1e-6)
    assert shares[0] != pytest.approx(whole / 2, rel=1e-3)


def test_router_and_experts_learn_from_the_output():
    layer = moe(experts=4, top_k=2)
    layer(torch.randn(2, 5, 8)).pow(2).sum().backward()
    assert layer.router.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in layer.experts.parameters())


def test_the_dense_gpt_is_unchanged_and_moe_adds_parameters_not_computation():
    torch.manual_seed(0)
    dense = GPT(GPTConfig())
    assert not any("router" in name or "experts" in name for name, _ in dense.named_parameters())
    torch.manual_seed(0)
    moe_gpt = GPT(GPTConfig(moe_experts=4, top_k=1, capacity_factor=4.0))
    x = torch.randint(0, 12, (2, 8))
    logits = moe_gpt(x)
    assert logits.shape == dense(x).shape
    mlp = sum(p.numel() for p in dense.blocks[0].mlp.parameters())
    assert sum(p.numel() for p in moe_gpt.blocks[0].mlp.experts.parameters()) == 4 * mlp
    assert F.cross_entropy(logits.reshape(-1, 12), x.reshape(-1)).isfinite()


def test_bad_moe_settings_are_refused():
    with pytest.raises(ValueError, match="top_k"):
        GPT(GPTConfig(moe_experts=2, top_k=3))
    with pytest.raises(ValueError, match="capacity_factor"):
        GPT(GPTConfig(moe_experts=2, capacity_factor=0.0))
