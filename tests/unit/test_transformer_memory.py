"""parallel_course.transformer_memory: a GPT's parameters from its shape, and memory per rank by
layout with Korthikanti et al.'s activation formulas (chapter 11's explorer); context parallelism,
experts and expert parallelism on hand-computed small cases, and c = e = 1 as without them."""

import pytest
import torch

from parallel_course import transformer_memory as tm
from parallel_course.gpt import GPT, MLP, GPTConfig, MoE, expert_capacity

SMALL = tm.Shape(layers=2, hidden=64, heads=4, vocab=12)  # the course's GPT


def test_parameters_match_the_course_gpt_but_its_position_embedding():
    cfg = GPTConfig()
    model = GPT(cfg)
    assert (
        sum(tm.parameters(SMALL).values()) == sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()
    )


def test_gpt2_small_shape_with_an_untied_head():
    h, v = 768, 50257
    assert tm.parameters(tm.SHAPES["GPT-2 small shape (12 x 768)"]) == {
        "blocks": 12 * (12 * h * h + 13 * h) + 2 * h,
        "embedding": v * h,
        "head": v * h,
    }


@pytest.mark.parametrize("layout", tm.LAYOUTS)
def test_one_process_is_the_whole_model_in_every_layout(layout):
    shape = tm.SHAPES["GPT-2 XL shape (48 x 1600)"]
    assert tm.parameters_per_rank(shape, layout, 1, 1) == sum(tm.parameters(shape).values())
    one = tm.per_rank_bytes(shape, layout, 1, 1, 1024, 2)
    assert one == tm.per_rank_bytes(shape, "ddp", 1, 1, 1024, 2)


def test_layouts_divide_the_parameters_as_the_script_does():
    shape, p = SMALL, tm.parameters(SMALL)
    whole = sum(p.values())
    assert tm.parameters_per_rank(shape, "fsdp", 8, 2) == whole / 8
    assert tm.parameters_per_rank(shape, "tp", 8, 2) == (p["blocks"] + p["head"]) / 2 + p["embedding"]
    assert tm.parameters_per_rank(shape, "tp+sp", 8, 2) == whole / 2
    assert tm.parameters_per_rank(shape, "2d", 8, 2) == whole / 8


def test_activation_formulas_of_the_paper():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B
    shape = tm.Shape(96, h, a)
    assert tm.activation_bytes_per_layer(shape, s, b) == s * b * h * (34 + 5 * a * s / h)
    tp = tm.activation_bytes_per_layer(shape, s, b, tp=8)
    sp = tm.activation_bytes_per_layer(shape, s, b, tp=8, sequence=True)
    assert tp == s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert tp - sp == pytest.approx(s * b * h * (10 - 10 / 8))  # what stays whole under TP alone
    assert tm.activation_bytes_per_layer(shape, s, b, tp=1, sequence=True) == tm.activation_bytes_per_layer(shape, s, b)


def test_checkpointing_keeps_block_inputs_and_one_block():
    shape = tm.SHAPES["GPT-3 6.7B shape (32 x 4096)"]
    s, b, h = 2048, 4, 4096
    plain = tm.per_rank_bytes(shape, "fsdp", 64, 8, s, b)
    ckpt = tm.per_rank_bytes(shape, "fsdp", 64, 8, s, b, checkpointing=True)
    assert ckpt["model states"] == plain["model states"]
    assert ckpt["activations"] == 32 * 2 * s * b * h + plain["activations"] / 32
    sp = tm.per_rank_bytes(shape, "2d", 64, 8, s, b, checkpointing=True)["activations"]
    assert sp == 32 * 2 * s * b * h / 8 + tm.activation_bytes_per_layer(shape, s, b, 8, sequence=True)


def test_bad_layouts_and_degrees_are_refused():
    with pytest.raises(ValueError, match="layout must be one of"):
        tm.parameters_per_rank(SMALL, "pipeline", 2, 1)
    with pytest.raises(ValueError, match="must divide"):
        tm.per_rank_bytes(SMALL, "2d", 6, 4, 128, 1)


# Context parallelism (cp) and experts (MoE, ep). Hand-computed cases on the course's GPT shape:
# h = 64, a = 4, s = 16, b = 2, so 32 tokens; with c = 2 each rank holds 8 positions of each sequence.
MOE = tm.MoE(experts=4, top_k=2, capacity_factor=1.25)


@pytest.mark.parametrize("layout", tm.LAYOUTS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_cp_1_and_ep_1_are_the_formulas_without_them(layout, checkpointing):
    shape, n, t, s, b = tm.SHAPES["GPT-3 6.7B shape (32 x 4096)"], 64, 8, 2048, 4
    h, a = shape.hidden, shape.heads
    tt = 1 if layout in ("ddp", "fsdp") else t
    if layout in ("tp+sp", "2d"):
        layer, kept_input = s * b * h * (34 / tt + 5 * a * s / (h * tt)), 2 * s * b * h / tt
    elif tt > 1:
        layer, kept_input = s * b * h * (10 + 24 / tt + 5 * a * s / (h * tt)), 2 * s * b * h
    else:
        layer, kept_input = s * b * h * (34 + 5 * a * s / h), 2 * s * b * h
    activations = shape.layers * kept_input + layer if checkpointing else shape.layers * layer
    states = tm.parameters_per_rank(shape, layout, n, t) * 16
    got = tm.per_rank_bytes(shape, layout, n, t, s, b, checkpointing, cp=1, ep=1, moe=None)
    assert got == {"model states": states, "activations": activations, "buffers": 0.0}


@pytest.mark.parametrize("layout", tm.LAYOUTS)
def test_cp_splits_no_parameter_and_divides_the_activations(layout):
    shape = tm.SHAPES["GPT-2 XL shape (48 x 1600)"]
    one = tm.per_rank_bytes(shape, layout, 16, 2, 4096, 2, cp=1)
    four = tm.per_rank_bytes(shape, layout, 16, 2, 4096, 2, cp=4)
    assert four["model states"] == one["model states"]
    assert four["activations"] == pytest.approx(one["activations"] / 4, rel=1e-12)
    ckpt = [tm.per_rank_bytes(shape, layout, 16, 2, 4096, 2, True, cp=c)["activations"] for c in (1, 4)]
    assert ckpt[1] == pytest.approx(ckpt[0] / 4, rel=1e-12)


def test_cp_activations_and_ring_buffers_by_hand():
    # No TP: 8 positions x 2 sequences x 64 x (34 + 5 x 4 heads x 16 keys / 64) = 1024 x 39.
    assert tm.activation_bytes_per_layer(SMALL, 16, 2, cp=2) == 39_936
    # One layer's backward: K, V, dK, dV blocks of 8 x 2 x 64 elements, one sent and one received, 2 bytes.
    assert tm.ring_buffer_bytes(SMALL, 16, 2, cp=2) == 8 * 1024 * 2 == 16_384
    assert tm.ring_buffer_bytes(SMALL, 16, 2, tp=2, cp=2) == 8_192  # the heads split by t
    assert tm.ring_buffer_bytes(SMALL, 16, 2, cp=1) == 0
    parts = tm.per_rank_bytes(SMALL, "ddp", 4, 1, 16, 2, cp=2)
    assert parts["buffers"] == 16_384 and parts["activations"] == 2 * 39_936


def test_moe_parameters_match_the_course_moe_gpt_but_its_position_embedding():
    model = GPT(GPTConfig(moe_experts=4))
    expected = sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()
    assert sum(tm.parameters(SMALL, MOE).values()) == expected
    # By hand: 2 blocks of attention 4h² + 4h, norms 4h, router 4h; final norm; 4 experts of 8h² + 5h.
    assert tm.parameters(SMALL, MOE) == {"blocks": 34_432, "experts": 264_704, "embedding": 768, "head": 768}


def test_ep_divides_the_experts_states_except_under_fsdp():
    whole = 34_432 + 264_704 + 768 + 768
    assert tm.parameters_per_rank(SMALL, "ddp", 4, 1, ep=1, moe=MOE) == whole
    assert tm.parameters_per_rank(SMALL, "ddp", 4, 1, ep=2, moe=MOE) == whole - 264_704 / 2
    assert tm.parameters_per_rank(SMALL, "tp", 4, 2, ep=2, moe=MOE) == (34_432 + 768) / 2 + 768 + 264_704 / 4
    for layout in ("fsdp", "2d"):  # FSDP shards every parameter over N already
        for ep in (1, 2):
            assert tm.parameters_per_rank(SMALL, layout, 4, 2, ep=ep, moe=MOE) == whole / 4


def test_moe_activations_by_hand_and_ep_divides_none():
    # Per token: attention and norms 64 x (15 + 5) = 1280; the MoE MLP 3h + 4E + k·2h + k·C·18h = 3344.
    assert tm.activation_bytes_per_layer(SMALL, 16, 2, moe=MOE) == 32 * (1280 + 3344) == 147_968
    # k·C slots per token: the course's capacity, E x ceil(C·T·k/E) slots, when it divides evenly.
    assert 4 * expert_capacity(32, 4, 2, 1.25) == 2 * 1.25 * 32
    acts = {ep: tm.per_rank_bytes(SMALL, "ddp", 4, 1, 16, 2, ep=ep, moe=MOE)["activations"] for ep in (1, 2, 4)}
    assert acts[1] == acts[2] == acts[4] == 2 * 147_968
    # The dispatch's send buffer: 2.5 slots x 32 tokens x 2h bytes, only with ep > 1.
    assert tm.dispatch_buffer_bytes(SMALL, 16, 2, ep=2, moe=MOE) == 10_240
    assert tm.dispatch_buffer_bytes(SMALL, 16, 2, ep=1, moe=MOE) == 0
    assert tm.per_rank_bytes(SMALL, "ddp", 4, 1, 16, 2, ep=2, moe=MOE)["buffers"] == 10_240


def test_moe_under_tensor_and_sequence_parallelism():
    t = 2
    slots = 2 * 1.25
    tp = tm.activation_bytes_per_layer(SMALL, 16, 2, tp=t, moe=MOE)
    mlp = 3 * 64 + 16 + 2 * 2 * 64 + slots * (2 * 64 + 16 * 64 / t)
    assert tp == 32 * 64 * (7 + 8 / t + 5 * 4 * 16 / (64 * t)) + 32 * mlp
    sp = tm.activation_bytes_per_layer(SMALL, 16, 2, tp=t, sequence=True, moe=MOE)
    assert sp == pytest.approx(tm.activation_bytes_per_layer(SMALL, 16, 2, moe=MOE) / t, rel=1e-12)


def test_bad_cp_and_ep_are_refused():
    with pytest.raises(ValueError, match="context-parallel degree 4 must divide the 2 data ranks"):
        tm.per_rank_bytes(SMALL, "tp", 4, 2, 16, 1, cp=4)
    with pytest.raises(ValueError, match="needs experts"):
        tm.parameters_per_rank(SMALL, "ddp", 4, 1, ep=2)
    with pytest.raises(ValueError, match="must divide the 4 experts"):
        tm.parameters_per_rank(SMALL, "ddp", 8, 1, ep=8, moe=MOE)


def saved_bytes(module, x) -> int:
    """Bytes of the tensors autograd keeps for backward in module(x), each storage once, parameters
    excluded (as train_gpt.py measures activations)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    assert out.requires_grad
    return sum(seen.values())


def test_the_course_mlp_and_moe_keep_what_the_formulas_count_in_fp32():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64)  # 32 tokens of the course's width
    # Dense: input h, GeLU input and output 8h, twice the table's 18h of 16 bits (it has no dropout).
    assert saved_bytes(MLP(GPTConfig()), x) == 2 * 32 * 18 * 64
    # MoE: only the slots depend on C; at C >= E/k no choice is dropped, so the same tokens are routed.
    kept = {}
    for c in (2.0, 4.0):
        torch.manual_seed(0)
        kept[c] = saved_bytes(MoE(GPTConfig(moe_experts=4, top_k=2, capacity_factor=c)), x)
    per_layer = {c: tm.activation_bytes_per_layer(SMALL, 16, 2, moe=tm.MoE(4, 2, c)) for c in (2.0, 4.0)}
    assert kept[4.0] - kept[2.0] == 2 * (per_layer[4.0] - per_layer[2.0]) == 2 * 32 * 2 * 2 * 18 * 64
