"""parallel_course.transformer_memory: a GPT's parameters from its shape, and memory per rank by
layout with Korthikanti et al.'s activation formulas (chapter 11's explorer)."""

import pytest

from parallel_course import transformer_memory as tm
from parallel_course.gpt import GPT, GPTConfig

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
