"""parallel_course.planner: FLOPs, memory and step time of a layout, checked against what is independent
of it: published figures (GPT-3's training compute and parameters, ZeRO's Figure 1, Megatron-LM's
formula and SC21 throughput table, which fitted the one efficiency), what torch counts and keeps
(FlopCounterMode, saved tensors, selective checkpointing) on small blocks, chapter 07a's schedule
simulator, chapter 11's activation table; then trainings the planner was not tuned on
(``published_runs``); the search, the rejections and the command line."""

import json
import math
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from parallel_course import memory
from parallel_course import planner as P
from parallel_course import transformer_memory as tm
from parallel_course.gpt import GPT, Block, GPTConfig
from parallel_course.model_parallel import idle_fraction, peak_activations, schedule
from parallel_course.published_runs import RUNS, describe_ratios, flops_as_tokens

A100 = P.cluster("a100-80gb", 8)
GPT3_6B = P.model("gpt3-6.7b")

# Brown et al. 2020, "Language Models are Few-Shot Learners", Table D.1: parameters (millions),
# total train compute (FLOPs; PF-days), all trained on 300 billion tokens; shapes from Table 2.1
# (layers, d_model), the 13B model's width taken as 40 heads x 128 = 5120 (see planner.MODELS).
GPT3_TABLE_D1 = {
    "gpt3-125m": (125, 2.25e20, 2.60),
    "gpt3-350m": (356, 6.41e20, 7.42),
    "gpt3-760m": (760, 1.37e21, 15.8),
    "gpt3-1.3b": (1320, 2.38e21, 27.5),
    "gpt3-2.7b": (2650, 4.77e21, 55.2),
    "gpt3-6.7b": (6660, 1.20e22, 139),
    "gpt3-13b": (12850, 2.31e22, 268),
    "gpt3-175b": (174600, 3.14e23, 3640),
}
PF_DAY = 1e15 * 86400

# Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", SC21, arXiv:2104.04473, Table 1: parameters (billions), heads, hidden, layers,
# tensor- and pipeline-parallel degrees, GPUs (A100 80GB on Selene), batch size, achieved
# teraFLOP/s per GPU (counting recomputation). Vocabulary 51,200, sequence 2048 (section 5.1).
SC21_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SC21_VOCAB, SC21_SEQ = 51200, 2048


def sc21_model(heads, hidden, layers):
    return P.Model("m", layers, hidden, heads, SC21_VOCAB, SC21_SEQ, tied=True)


# --- FLOPs -------------------------------------------------------------------------------------------


def test_flops_per_token_counts_matmul_weights_and_attention_by_hand():
    n, h, s, v = 2, 8, 16, 10
    weights = n * (4 * h * h + 2 * h * 4 * h) + v * h
    assert P.flops_per_token(layers=n, hidden=h, seq_len=s, vocab=v) == 6 * weights + 12 * n * h * s
    assert P.flops_per_token(layers=n, hidden=h, seq_len=s, vocab=v, attention=False) == 6 * weights
    # Experts: a token goes through top-k experts' MLPs and the router.
    moe = P.flops_per_token(layers=n, hidden=h, seq_len=s, vocab=v, moe_experts=4, top_k=2)
    assert moe == 6 * (n * (4 * h * h + 2 * 2 * h * 4 * h + 4 * h) + v * h) + 12 * n * h * s
    # Grouped-query attention (2 of 4 heads: k and v h/2 wide) and SwiGLU (three h x f matrices).
    gqa = P.flops_per_token(layers=n, hidden=h, seq_len=s, vocab=v, heads=4, kv_heads=2, ffn=12, mlp="swiglu")
    assert gqa == 6 * (n * (2 * h * h + 2 * h * h // 2 + 3 * h * 12) + v * h) + 12 * n * h * s
    with pytest.raises(ValueError):
        P.flops_per_token(layers=0, hidden=h, seq_len=s, vocab=v)
    with pytest.raises(ValueError):
        P.flops_per_token(layers=n, hidden=h, seq_len=s, vocab=v, moe_experts=2, top_k=3)


def matmul_attention(q, k, v):
    """Causal attention written with two matmuls, which torch's FLOP counter sees (it does not
    count the CPU kernel of ``scaled_dot_product_attention``); masked, so the whole square."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def test_flops_per_token_equals_what_torch_counts_on_the_course_gpt():
    """torch's FlopCounterMode on a forward and backward of the course's GPT counts 6 FLOPs per
    matmul weight and token, and, attention written as two matmuls, PaLM's 12·l·h·s on top: the
    planner's model FLOPs per token, exactly."""
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg)
    batch, seq = 2, cfg.block_size
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    shape = dict(layers=cfg.n_layers, hidden=cfg.d_model, seq_len=seq, vocab=cfg.vocab_size)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    assert counter.get_total_flops() / (batch * seq) == P.flops_per_token(**shape, attention=False)
    for block in model.blocks:
        block.attn.attention = matmul_attention
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    assert counter.get_total_flops() / (batch * seq) == P.flops_per_token(**shape)


H, F_WIDTH, HEADS, KV_HEADS = 64, 96, 4, 2


class LlamaBlock(nn.Module):
    """A Llama-style block as torchtitan writes it (no biases, grouped-query attention, SwiGLU
    ``w2(silu(w1 x) * w3 x)``), norms left out: what the planner's Llama accounting is about."""

    def __init__(self):
        super().__init__()
        d = H // HEADS
        self.q, self.o = nn.Linear(H, H, bias=False), nn.Linear(H, H, bias=False)
        self.k, self.v = nn.Linear(H, KV_HEADS * d, bias=False), nn.Linear(H, KV_HEADS * d, bias=False)
        self.w1, self.w3 = nn.Linear(H, F_WIDTH, bias=False), nn.Linear(H, F_WIDTH, bias=False)
        self.w2 = nn.Linear(F_WIDTH, H, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        d = H // HEADS
        q = self.q(x).view(B, T, HEADS, d).transpose(1, 2)
        k, v = (lin(x).view(B, T, KV_HEADS, d).transpose(1, 2) for lin in (self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, H))
        return x + self.w2(F.silu(self.w1(x)) * self.w3(x))


LLAMA_SMALL = P.Model("small", 1, H, HEADS, 10, 16, ffn=F_WIDTH, kv_heads=KV_HEADS, mlp="swiglu", bias=False)


def torchtitan_policy():
    """torchtitan's per-op policy (``_get_custom_policy``): save every matmul's output but every
    second one's, and attention's; recompute the rest. Its list names CUDA's attention kernels;
    a CPU run needs the CPU one."""
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func == torch.ops.aten.mm.default:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            return CheckpointPolicy.MUST_SAVE if counts[mode] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        if func == torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def counted_flops(block, x, context=None) -> float:
    with FlopCounterMode(display=False) as counter:
        out = block(x) if context is None else checkpoint(block, x, use_reentrant=False, context_fn=context)
        out.sum().backward()
    return counter.get_total_flops() / (x.shape[0] * x.shape[1])


def test_gqa_swiglu_flops_and_what_each_recomputation_runs_again_as_torch_counts():
    """FlopCounterMode (attention's CPU kernel uncounted) on a Llama-style block: 6 per weight and
    token with GQA's narrower k, v and SwiGLU's three matrices; torchtitan's per-op policy runs
    exactly ``recomputed_matmuls`` again (k, proj, w3). torch's plain checkpoint runs the forward
    again but stops at the last saved tensor it needs (w2's output is needed by nothing): the
    planner's ``full`` counts the whole forward, as Megatron-LM's formula does."""
    torch.manual_seed(0)
    block, x = LlamaBlock(), torch.randn(2, 16, H, requires_grad=True)
    flops = LLAMA_SMALL.layer_flops("none", "flash")
    plain = counted_flops(block, x)
    assert plain == flops["matmuls"] == 6 * sum(w for _, w in LLAMA_SMALL.matmuls())
    assert [name for name, _ in P.recomputed_matmuls(LLAMA_SMALL)] == ["k", "proj", "w3"]
    op = counted_flops(block, x, lambda: create_selective_checkpoint_contexts(torchtitan_policy()))
    assert op - plain == LLAMA_SMALL.layer_flops("selective-op", "flash")["recompute"]
    full = counted_flops(block, x, lambda: torch.utils.checkpoint.noop_context_fn())
    forward_matmuls = LLAMA_SMALL.layer_flops("full", "flash")["recompute"] - 2 * H * LLAMA_SMALL.seq_len
    assert full - plain == forward_matmuls - 2 * F_WIDTH * H


@pytest.mark.parametrize("name", GPT3_TABLE_D1)
def test_gpt3_training_compute_and_parameters_of_table_d1(name):
    """Brown et al. 2020, Table D.1: compute = 6 x parameters x 300B tokens (attention left out),
    in FLOPs and in PF-days. The planner's 6 x matmul weights (no position embeddings, no biases,
    a head used once) is within 2% of it; attention adds 12·l·h·s per token, a share that grows as
    the width h shrinks against the fixed sequence of 2048: about a third for the 125M model, under
    3% for the 175B model. The parameters: the presets' (head tied to the embedding, as GPT-2's)
    plus 2048 learned positions are the table's within 0.5%; an untied head would add V·h, ten
    times further off (3% of the 6.7B model)."""
    millions, flops, pf_days = GPT3_TABLE_D1[name]
    tokens = 300e9
    assert 6 * millions * 1e6 * tokens == pytest.approx(flops, rel=5e-3)
    assert flops / PF_DAY == pytest.approx(pf_days, rel=5e-3)
    m = P.model(name)
    tied, untied = (x.params() + 2048 * m.hidden - millions * 1e6 for x in (m, replace(m, tied=False)))
    assert m.tied and abs(tied) < 5e-3 * millions * 1e6 and abs(untied) > 10 * abs(tied)
    without_attention = m.flops_per_token(attention=False) * tokens
    assert without_attention == pytest.approx(flops, rel=0.02)
    share = 12 * m.layers * m.hidden * m.seq_len / (6 * millions * 1e6)
    assert share == pytest.approx((m.flops_per_token() - m.flops_per_token(attention=False)) / (6 * millions * 1e6))
    if name == "gpt3-125m":
        assert 0.25 < share < 0.35
    if name == "gpt3-175b":
        assert share < 0.03


def test_attention_share_falls_with_width():
    shares = [m.flops_per_token() / m.flops_per_token(attention=False) for n, m in P.MODELS.items() if "gpt3" in n]
    assert shares == sorted(shares, reverse=True)


def test_llama3_405b_has_its_published_size():
    """Llama 3's Table 3 shape gives 405.9 B parameters (untied head, no biases, RMSNorm)."""
    assert P.model("llama3-405b").params() == pytest.approx(405.85e9, rel=1e-3)


# --- memory ------------------------------------------------------------------------------------------


def test_zero_figure_1_reproduced_by_the_planner():
    """Rajbhandari et al., ZeRO (SC20, arXiv:1910.02054), Figure 1: 7.5B parameters, 64 GPUs,
    K = 12: 120, 31.4, 16.6 and 1.9 GB of model states per GPU for DDP, ZeRO-1, 2, 3. A 36 x 4096
    shape with a vocabulary of 30,522 has 7.50 B parameters. ZeRO-2 whose gradients accumulate in
    a full buffer over micro-batches holds what ZeRO-1 holds."""
    m = P.Model("7.5B", 36, 4096, 32, 30522, 1024)
    assert m.params() == pytest.approx(7.5e9, rel=5e-4)

    def states(layout):
        parts = P.memory_per_gpu(m, layout)
        return (parts["weights"] + parts["gradients"] + parts["optimizer"]) / P.GB

    assert [round(states(P.Layout(dp=64, zero=z)), 1) for z in range(4)] == [120.0, 31.4, 16.6, 1.9]
    assert states(P.Layout(dp=64, zero=2, accumulate="full")) == pytest.approx(states(P.Layout(dp=64, zero=1)))
    assert states(P.Layout(dp=64, zero=3, accumulate="full")) == pytest.approx(1.9 + 15 - 15 / 64, abs=0.05)


@pytest.mark.parametrize("experts", [0, 8])
def test_params_are_transformer_memorys(experts):
    m = P.Model("m", 4, 64, 4, 100, 32, moe_experts=experts, top_k=2)
    shape, moe = tm.Shape(4, 64, 4, 100), tm.MoE(8, 2) if experts else None
    assert m.params() == sum(tm.parameters(shape, moe).values())


@pytest.mark.parametrize("experts", [0, 8])
@pytest.mark.parametrize("t, sp, cp", [(1, True, 1), (2, False, 1), (8, True, 1), (4, True, 4), (2, False, 2)])
def test_activations_of_a_naive_kernel_are_chapter_11s_table(t, sp, cp, experts):
    """A GPT block with naive attention, dropout, GELU of 4h and no GQA keeps Korthikanti et al.'s
    Table 2 (``transformer_memory``, chapter 11) under tp, sp and cp, with and without experts; full
    recomputation keeps each block's input."""
    m = P.Model("m", 4, 256, 8, 100, 64, moe_experts=experts, top_k=2)
    moe = tm.MoE(8, 2) if experts else None
    layout = P.Layout(dp=8, tp=t, cp=cp, sp=sp, micro_batch=2, attention="naive", ep=1)
    theirs = tm.activation_bytes_per_layer(tm.Shape(4, 256, 8, 100), 64, 2, t, sp and t > 1, cp, moe)
    assert P.activation_bytes_per_layer(m, layout) == pytest.approx(theirs)
    assert P.activation_bytes_per_layer(m, layout, "full") == 2 * 64 / cp * 2 * 256 / (t if sp else 1)


def saved(module, x) -> dict[int, torch.Tensor]:
    """The tensors autograd keeps for backward in module(x), each storage once, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return seen


def fp32_bytes_per_token(m: P.Model, layout: P.Layout, tokens: int) -> float:
    """The planner's 16-bit terms as a float32 model keeps them: twice, but the fp32 statistics."""
    terms = P.activation_terms(m, layout)
    stats = terms.get("softmax statistics", (0.0, ""))[0]
    return 2 * (sum(v for v, _ in terms.values()) - stats) + stats


def test_the_course_block_keeps_what_the_planner_counts():
    """What autograd keeps in the course's block (float32, CPU's fused attention kernel, no
    dropout): the planner's FlashAttention terms, twice for float32, plus the LayerNorms' fp32 mean
    and 1/std (8 bytes a token each, which the table leaves out). Written with two matmuls, the
    attention keeps its a·s probabilities per token instead of the statistics, plus the s x s mask."""
    cfg = GPTConfig()
    torch.manual_seed(0)
    block, x = Block(cfg), torch.randn(2, cfg.block_size, cfg.d_model, requires_grad=True)
    tokens = x.shape[0] * x.shape[1]
    m = P.Model("course", 1, cfg.d_model, cfg.n_heads, cfg.vocab_size, cfg.block_size, dropout=False)
    kept = sum(t.untyped_storage().nbytes() for t in saved(block, x).values())
    norm_statistics = 2 * 8 * tokens
    assert kept == fp32_bytes_per_token(m, P.Layout(), tokens) * tokens + norm_statistics
    block.attn.attention = matmul_attention
    kept = sum(t.untyped_storage().nbytes() for t in saved(block, x).values())
    mask = cfg.block_size**2
    assert kept == fp32_bytes_per_token(m, P.Layout(attention="naive"), tokens) * tokens + norm_statistics + mask


def test_a_llama_block_keeps_what_the_planner_counts():
    """SwiGLU keeps its input and four f-wide tensors (w1's and w3's outputs, silu's, their
    product); grouped-query attention keeps K and V h_kv wide (torch's CPU kernel expands them
    inside, as FlashAttention's GQA kernels do not need to)."""
    torch.manual_seed(0)
    block, x = LlamaBlock(), torch.randn(2, 16, H, requires_grad=True)
    tokens = 32
    kept = list(saved(block, x).values())
    expected = fp32_bytes_per_token(replace(LLAMA_SMALL, dropout=False), P.Layout(), tokens)
    # This block has no norms: their inputs, 4h of 16 bits, are not there.
    expected -= 2 * 4 * H
    assert sum(t.untyped_storage().nbytes() for t in kept) == expected * tokens
    assert sum(tuple(t.shape) == (2, KV_HEADS, 16, H // HEADS) for t in kept) == 2


def test_recomputation_policies_trade_memory_for_flops():
    m, layout = P.model("llama3-8b"), P.Layout(dp=8, tp=8)
    memory_ = [P.activation_bytes_per_layer(m, layout, r) for r in P.RECOMPUTE]
    flops = [sum(m.layer_flops(r, "flash").values()) for r in P.RECOMPUTE]
    none, selective, op, full = memory_
    # FlashAttention keeps no scores: Megatron's selective recomputation frees only its statistics.
    assert none > selective > 0.99 * none and none > op > full
    assert flops[0] < flops[1] < flops[2] < flops[3]
    naive = replace(layout, attention="naive")
    scores = P.activation_terms(m, naive)["scores"][0] * m.seq_len / layout.tp
    drop = P.activation_bytes_per_layer(m, naive) - P.activation_bytes_per_layer(m, naive, "selective")
    assert drop == pytest.approx(scores)


def test_one_stage_is_transformer_memorys_layout():
    """pp = cp = ep = 1, an untied head: the weights, gradients and optimizer states are
    ``transformer_memory``'s for its layouts with sequence parallelism (ZeRO-3 as FSDP)."""
    m = P.Model("m", 32, 4096, 32, 50257, 2048)
    shape = tm.Shape(32, 4096, 32, 50257)
    for layout, name in ((P.Layout(8), "ddp"), (P.Layout(8, zero=3), "fsdp"), (P.Layout(2, tp=4), "tp+sp")):
        parts = P.memory_per_gpu(m, layout)
        theirs = tm.per_rank_bytes(shape, name, layout.gpus, layout.tp, 2048, 1)["model states"]
        assert parts["weights"] + parts["gradients"] + parts["optimizer"] == pytest.approx(theirs)
    layout = P.Layout(4, tp=2, zero=3)
    assert P.stage_parameters(m, layout) == pytest.approx(tm.parameters_per_rank(shape, "2d", 8, 2))


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_are_memorys(zero):
    m = P.Model("m", 32, 4096, 32, 50257, 2048)
    parts = P.memory_per_gpu(m, P.Layout(16, zero=zero))
    got = parts["weights"] + parts["gradients"] + parts["optimizer"]
    assert got == pytest.approx(memory.per_rank_bytes(m.params(), 16, zero))


def test_stages_balance_the_ends_and_need_not_divide_the_layers():
    assert P.stage_layers(126, 16) == [7] + [8] * 14 + [7]  # Llama 3 405B
    assert P.stage_layers(70, 12) == [5] + [6] * 10 + [5]  # BLOOM
    assert P.stage_layers(32, 4) == [8] * 4 and P.stage_layers(10, 4) == [2, 3, 3, 2]
    assert P.stage_layers(9, 2) == [5, 4] and P.stage_layers(5, 1) == [5]
    with pytest.raises(ValueError):
        P.stage_layers(4, 5)
    bad = P.plan(GPT3_6B, A100, P.Layout(1, pp=64), 512)
    assert "leaves a stage without any of the 32 layers" in bad.problems[0]


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (4, 4, 2), (8, 16, 2), (4, 8, 4), (16, 16, 2), (6, 12, 3)])
def test_in_flight_and_bubble_are_chapter_07as_schedules(p, m, v):
    """The closed forms the planner uses against chapter 07a's event simulation of the same
    schedule: the (micro-batch, chunk) pairs each stage holds at most, and the idle share."""
    kind = "1f1b" if v == 1 else "interleaved"
    layout = P.Layout(pp=p, interleave=v)
    assert [P.in_flight(layout, stage, m) * v for stage in range(p)] == peak_activations(kind, p, m, v)
    ops = schedule(kind, p, m, 1, 2, n_chunks=v)
    assert P.bubble_share(p, m, v) == pytest.approx(idle_fraction(ops))


def test_pipeline_stages_hold_their_layers_the_vocabulary_and_in_flight_micro_batches():
    m, h, v = GPT3_6B, GPT3_6B.hidden, GPT3_6B.vocab
    layout = P.Layout(1, pp=4)
    # Tied: the first stage holds the embedding, the last a copy for the head, and the final norm.
    assert P.stage_parameters(m, layout, 0) == 8 * (12 * h * h + 13 * h) + v * h
    assert P.stage_parameters(m, layout, 3) == 8 * (12 * h * h + 13 * h) + v * h + 2 * h
    one = P.memory_by_stage(m, layout, micro_batches=1)
    sixteen = P.memory_by_stage(m, layout, micro_batches=16)
    assert [s["activations"] / one[0]["activations"] for s in sixteen] == pytest.approx([4, 3, 2, 1])
    assert [s["logits"] > 0 for s in one] == [False, False, False, True]
    interleaved = P.memory_by_stage(m, replace(layout, interleave=2), micro_batches=16)
    assert interleaved[0]["activations"] / sixteen[0]["activations"] == pytest.approx((4 + 6 + 1) / 2 / 4)


def test_context_and_expert_parallelism_go_through_transformer_memory():
    m = P.model("moe-1.3b-64e")
    layout = P.Layout(8, cp=2, ep=8, zero=3, attention="naive")
    ours = P.memory_per_gpu(m, layout)
    theirs = tm.per_rank_bytes(tm.Shape(24, 2048, 24, 50257), "fsdp", 16, 1, 2048, 1, cp=2, ep=8, moe=tm.MoE(64, 2))
    assert ours["activations"] == pytest.approx(theirs["activations"])
    assert ours["weights"] + ours["gradients"] + ours["optimizer"] == pytest.approx(theirs["model states"])


def test_logits_are_sharded_replicated_or_chunked():
    m, b = P.model("llama3-8b"), 2
    parts = {loss: P.memory_per_gpu(m, P.Layout(1, tp=8, micro_batch=b, loss=loss))["logits"] for loss in P.LOSS}
    assert parts["replicated"] == 8 * m.seq_len * b * m.vocab == 8 * parts["parallel"]
    assert parts["chunked"] == 8 * P.LOSS_CHUNK * m.vocab


# --- time --------------------------------------------------------------------------------------------


def test_hardware_flops_are_megatrons_formula():
    """Narayanan et al. SC21, eq. 3: 96·B·s·l·h²(1 + s/6h + V/16lh) FLOPs per step with full
    recomputation; without it 72·B·s·l·h²(1 + s/6h + V/12lh), the model FLOPs."""
    for _, heads, h, layers, *_ in SC21_TABLE_1:
        m, s, v = sc21_model(heads, h, layers), SC21_SEQ, SC21_VOCAB
        assert m.hardware_flops_per_token("full", "naive") * s == pytest.approx(
            96 * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
        )
        assert m.flops_per_token() * s == pytest.approx(
            72 * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
        )
        assert m.hardware_flops_per_token("none", "naive") == m.flops_per_token()


@pytest.mark.parametrize("row", SC21_TABLE_1, ids=[f"{r[0]}B" for r in SC21_TABLE_1])
def test_sc21_parameter_counts(row):
    """SC21's parameter formula P = 12·l·h²(1 + 13/12h + (V + s)/12lh) (tied embeddings, learned
    positions) gives Table 1's first column to one decimal; the planner's tied count plus the
    positions is the formula plus the final norm's 2h."""
    billions, heads, h, layers, *_ = row
    params = 12 * layers * h * h * (1 + 13 / (12 * h) + (SC21_VOCAB + SC21_SEQ) / (12 * layers * h))
    assert round(params / 1e9, 1) == billions
    assert sc21_model(heads, h, layers).params() + SC21_SEQ * h == pytest.approx(params + 2 * h)


def sc21_predictions():
    """The planner's predicted teraFLOP/s per GPU (recomputation counted, as the table counts it)
    for each row: the row's degrees, every block recomputed, micro-batch 1, no sequence parallelism
    or FlashAttention (2021), the A100 preset."""
    out = []
    for _, heads, h, layers, t, p, gpus, batch, achieved in SC21_TABLE_1:
        layout = P.Layout(gpus // (t * p), t, p, micro_batch=1, recompute="full", attention="naive", sp=False)
        got = P.plan(sc21_model(heads, h, layers), P.cluster("a100-80gb", gpus // 8), layout, batch)
        out.append((got.hardware_flops_per_gpu / 1e12, achieved))
    return out


def test_sc21_throughput_within_a_quarter_with_one_efficiency():
    """Table 1's achieved teraFLOP/s per GPU against the planner's prediction, one efficiency
    (the preset's) for all ten rows: every row within 25%, the geometric mean of the ratios within
    5% of 1. The planner is high on the small models (1.7B by about a fifth: narrow matmuls reach
    less of peak than one efficiency says) and low on the largest (by about a fifth: their last
    stage, which also computes the head, paces the pipeline in the planner)."""
    ratios = [predicted / achieved for predicted, achieved in sc21_predictions()]
    assert all(0.75 < r < 1.25 for r in ratios), ratios
    assert math.exp(sum(math.log(r) for r in ratios) / len(ratios)) == pytest.approx(1, abs=0.05)


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_published_runs_it_was_not_tuned_on(run):
    """Trainings that ran (``published_runs``): the predicted tokens/s within x1.4 of what each
    achieved. BLOOM's and MT-NLG's layouts fit. Llama 3's do not in this accounting (what stock
    autograd keeps, Megatron-LM's interleaved warm-up; Meta's kernels and schedule are
    unpublished): over by less than the GPU's memory again, never by hundreds of GB, the
    rejection naming the activations and a recomputation that fits. At 128K, where attention is
    most of the FLOPs, the achieved tokens/s depend on how the paper counts the masked half of the
    square: both readings are within x1.4."""
    p = run.plan()
    ratio = p.tokens_per_s / run.achieved_tokens_per_s
    assert 1 / 1.4 < ratio < 1.4, (run.name, ratio)
    usable = p.usable * p.cluster.memory_bytes
    if run.name.startswith(("BLOOM", "MT-NLG")):
        assert p.fits, p.reasons
    else:
        assert not p.fits and usable < p.memory_bytes < 2 * p.cluster.memory_bytes
        assert "largest part: activations" in p.problems[0] and "recompute=" in p.reasons[-1]
        if run.model.seq_len > 8192:
            causal = flops_as_tokens(380, run.layout.gpus, run.model, causal_half=True)
            assert 1 / 1.4 < p.tokens_per_s / causal < 1.4


def test_mfu_is_model_flops_over_peak_and_recomputation_is_not_counted():
    plan = P.plan(GPT3_6B, A100, P.Layout(16, tp=4, micro_batch=2, recompute="full"), 512)
    assert plan.mfu == pytest.approx(plan.tokens_per_s * GPT3_6B.flops_per_token() / (64 * 312e12))
    assert plan.hardware_flops_per_gpu / 312e12 > plan.mfu  # recomputation: more FLOPs, no more model FLOPs


def test_step_parts_follow_the_layout():
    base = P.plan(GPT3_6B, A100, P.Layout(16, tp=4, micro_batch=2), 512)
    assert base.bubble_s == 0 and base.comm_s["pp"] == 0 and base.links["tp"] == "intra"
    assert base.links["dp"] == "inter"  # 4 x 16 ranks: the data-parallel ring leaves the node
    ckpt = P.plan(GPT3_6B, A100, P.Layout(16, tp=4, micro_batch=2, recompute="full"), 512)
    layer = GPT3_6B.layer_flops("none", "flash")
    added = GPT3_6B.layer_flops("full", "flash")["recompute"] / (sum(layer.values()) + 6 * 50257 * 4096 / 32)
    assert ckpt.compute_s == pytest.approx(base.compute_s * (1 + added))
    assert ckpt.memory["activations"] < base.memory["activations"] / 5
    pipe = P.plan(GPT3_6B, A100, P.Layout(4, tp=4, pp=4, micro_batch=2), 512)
    assert pipe.bubble_s == pytest.approx(3 * (pipe.compute_s + pipe.comm_s["tp"]) / pipe.micro_batches)
    assert pipe.step_s == pytest.approx(pipe.compute_s + pipe.exposed_comm_s + pipe.bubble_s)
    interleaved = P.plan(GPT3_6B, A100, P.Layout(4, tp=4, pp=4, micro_batch=2, interleave=2), 512)
    assert interleaved.bubble_s == pytest.approx(pipe.bubble_s / 2)
    # Uneven stages: 30 layers over 4 stages is 7, 8, 8, 7: the inner stages pace the pipeline.
    uneven = P.plan(replace(GPT3_6B, layers=30), A100, P.Layout(4, tp=4, pp=4, micro_batch=2), 512)
    assert uneven.fits and uneven.compute_s == pytest.approx(8 / 32 * 4 * base.compute_s * 30 / 32 * 32 / 30, rel=0.05)
    # Overlap never hides more than there is to hide, nor more than the compute.
    for p in (base, ckpt, pipe, interleaved):
        assert 0 <= p.hidden_s <= min(sum(p.comm_s.values()), p.compute_s)


def test_network_bytes_cross_each_node_boundary_once_per_ring():
    """A ring over n ranks carries 2(n-1)/n·S across every node boundary, whatever the number of
    its ranks in a node; the node's NICs are shared by the groups that run at once. With all 8
    GPUs of each node in one data-parallel ring (tp = 1) the ring has the whole node's NICs; with
    tp = 8 each of the 8 rings has one NIC's worth: 8 times slower for the same bytes."""
    c, nbytes = P.cluster("a100-80gb", 8), 8e9
    whole = P.all_reduce_s(c, 64, 8, nbytes)
    one = P.all_reduce_s(c, 8, 1, nbytes)
    assert whole == pytest.approx(2 * 63 * c.nic[0] + 2 * 63 / 64 * nbytes / (8 * 25e9))
    assert one == pytest.approx(2 * 7 * c.nic[0] + 2 * 7 / 8 * nbytes / 25e9)
    assert P.group(c, P.Layout(64), "dp") == (64, 8) and P.group(c, P.Layout(8, tp=8), "dp") == (8, 1)
    fewer = P.cluster("a100-80gb", 8, nics=4, nic=(10e-6, 12.5e9))
    assert P.all_reduce_s(fewer, 8, 1, nbytes) > 3.9 * one


def test_zero_2_and_3_accumulate_both_ways():
    """Sharded: a reduce-scatter every micro-batch, gradients stored sharded; full: one reduction
    per step into an unsharded buffer."""
    layouts = {how: P.Layout(64, zero=3, micro_batch=1, accumulate=how) for how in P.ACCUMULATE}
    plans = {how: P.plan(GPT3_6B, A100, layout, 512) for how, layout in layouts.items()}
    m = plans["sharded"].micro_batches
    rs = P.all_gather_s(A100, 64, 8, 2 * P.stage_parameters(GPT3_6B, P.Layout(64)))
    gathers = m * 2 * rs
    assert plans["sharded"].comm_s["dp"] == pytest.approx(gathers + m * rs)
    assert plans["full"].comm_s["dp"] == pytest.approx(gathers + rs)
    assert plans["full"].memory["gradients"] == pytest.approx(64 * plans["sharded"].memory["gradients"])


def test_tensor_parallel_collectives_are_exposed_and_grow_across_nodes():
    inside = P.plan(GPT3_6B, A100, P.Layout(8, tp=8), 512)
    across = P.plan(GPT3_6B, A100, P.Layout(4, tp=16), 512)
    assert across.links["tp"] == "inter" and any("spans nodes" in r for r in across.problems)
    assert across.comm_s["tp"] > 5 * inside.comm_s["tp"]


# --- the search and the rejections ---------------------------------------------------------------


def test_search_ranks_fitting_layouts_and_names_why_the_others_fail():
    feasible, rejected = P.search(GPT3_6B, A100, 512)
    assert feasible and rejected
    assert [p.step_s for p in feasible] == sorted(p.step_s for p in feasible)
    for p in feasible:
        assert p.layout.gpus == A100.gpus and p.memory_bytes <= 0.9 * A100.memory_bytes and not p.problems
    for p in rejected:
        assert p.problems and not p.fits
    reasons = " ".join(P.rejection_summary(rejected))
    assert "GB per GPU" in reasons and "spans nodes" in reasons and "leaves a stage" in reasons


def test_a_rejection_names_the_part_and_what_would_make_it_fit():
    """Plain DDP of 6.65 B parameters: 16 bytes each, more than a GPU; the optimizer's 12 are the
    largest part, and each ZeRO stage fixes it; a fix really fits."""
    ddp = P.plan(GPT3_6B, A100, P.Layout(64), 512)
    assert "needs 116 GB per GPU" in ddp.problems[0] and "largest part: optimizer, 80 GB" in ddp.problems[0]
    assert ddp.reasons[-1].startswith("fits with zero=1")
    assert P.plan(GPT3_6B, A100, P.Layout(64, zero=1), 512).fits
    assert P.plan(GPT3_6B, A100, P.Layout(8, tp=8), 512).fixes == []


def test_a_layout_larger_than_the_cluster_is_refused():
    p = P.plan(GPT3_6B, A100, P.Layout(128), 512)
    assert not p.fits and "needs 128 GPUs, the cluster has 64" in p.problems
    bad = P.plan(GPT3_6B, A100, P.Layout(64, micro_batch=3), 512)
    assert "not a multiple" in bad.problems[0]
    gqa = P.plan(P.model("llama3-8b"), A100, P.Layout(4, tp=16), 512)
    assert "tp=16 does not divide the 8 key/value heads" in gqa.problems


def test_a_layout_parses_and_prints_back():
    text = "tp=8,pp=16,dp=128,cp=1,zero=2,micro=1,recompute=none,interleave=2"
    layout = P.Layout.parse(text)
    assert layout == P.Layout(dp=128, tp=8, pp=16, zero=2, micro_batch=1, interleave=2)
    assert P.Layout.parse(str(layout)) == layout and P.Layout.parse("") == P.Layout()
    odd = P.Layout.parse("dp=4 tp=2 sp=0 attention=naive loss=chunked zero=3 accumulate=full recompute=selective-op")
    assert P.Layout.parse(str(odd)) == odd
    for bad, message in (("tp=x", "must be an integer"), ("gpus=8", "keys"), ("recompute=some", "must be one of")):
        with pytest.raises(ValueError, match=message):
            P.Layout.parse(bad)


# --- command line --------------------------------------------------------------------------------


def test_command_line_help_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "parallel_course.planner", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "gpt3-6.7b" in out.stdout and "a100-80gb" in out.stdout and "--layout" in out.stdout


def test_command_line_evaluates_a_layout_as_json(capsys):
    """Llama 3's 16K layout (the issue's example): one object with the fields the course
    documents; enough nodes for the layout when --nodes is left out."""
    layout = "tp=8,pp=16,dp=128,cp=1,zero=2,micro=1,recompute=none,interleave=2"
    args = ["--model", "llama3-405b", "--cluster", "h100-80gb", "--global-batch", "2048", "--layout", layout]
    assert P.main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    expected = P.plan(P.model("llama3-405b"), P.cluster("h100-80gb", 2048), P.Layout.parse(layout), 2048)
    assert got["fits"] is False and got["mfu"] == pytest.approx(expected.mfu) and 0 < got["mfu"] < 1
    assert got["tokens_per_s"] == pytest.approx(expected.tokens_per_s) and got["step_s"] > 0
    assert set(got["memory_gb"]) >= {"total", "weights", "gradients", "optimizer", "activations", "logits", "buffers"}
    assert got["reasons"] == expected.reasons and "activations" in got["reasons"][0]
    # The same with a model of flags and a GPU of 141 GB: now it fits.
    shape = "--layers 126 --hidden 16384 --heads 128 --kv-heads 8 --ffn 53248 --vocab 128256 --seq 8192"
    flags = [*shape.split(), "--mlp", "swiglu", "--head", "untied", "--gpu-memory-gb", "141"]
    assert P.main([*args[2:], *flags, "--json"]) == 0
    custom = json.loads(capsys.readouterr().out)
    assert custom["memory_gb"]["total"] == pytest.approx(got["memory_gb"]["total"], rel=0.01) and custom["fits"]


def test_command_line_ranks_and_refuses_bad_arguments(capsys):
    assert P.main(["--model", "gpt3-6.7b", "--cluster", "a100-80gb", "--nodes", "8", "--global-batch", "512"]) == 0
    out = capsys.readouterr().out
    assert "feasible layouts, best first" in out and "rejected, by reason" in out and "the best in detail" in out
    assert P.main(["--nodes", "8", "--json", "--top", "2"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    # Fewer, slower NICs: the same layout's step grows.
    steps = []
    for extra in ([], ["--nics", "4", "--nic-gbps", "100"]):
        assert P.main(["--nodes", "8", "--layout", "dp=64,zero=3", "--json", *extra]) == 0
        steps.append(json.loads(capsys.readouterr().out)["step_s"])
    assert steps[1] > steps[0]
    for bad, message in (
        (["--model", "gpt-5"], "model must be one of"),
        (["--nodes", "0"], "nodes must be >= 1"),
        (["--cp", "3"], "every --cp must divide"),
        (["--layout", "tp=2,gpus=4"], "layout items are key=value"),
        (["--layers", "4"], "--hidden, --heads, --vocab, --seq missing"),
    ):
        with pytest.raises(SystemExit) as exit_:
            P.main(bad)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and message in err


def test_describe_step_parts_says_each_layouts_step_by_part_and_which_are_rejected():
    model, cluster = P.model("gpt3-6.7b"), P.cluster("a100-80gb", nodes=8)
    plans = {
        "pp": P.plan(model, cluster, P.Layout(4, tp=4, pp=4, micro_batch=32, recompute="full"), 512),
        "tp=16": P.plan(model, cluster, P.Layout(4, tp=16, zero=1, micro_batch=4), 512),
    }
    alt = P.describe_step_parts(plans)
    pp = plans["pp"]
    assert (
        f"pp: {pp.step_s:.2f} s = compute {pp.compute_s:.2f} + exposed communication "
        f"{pp.exposed_comm_s:.2f} + bubble {pp.bubble_s:.2f};"
    ) in alt
    assert pp.bubble_s > 1 and alt.endswith("bubble 0.00 (rejected).")


def test_describe_ratios_says_each_runs_ratio_and_which_lie_outside_the_band():
    alt = describe_ratios(["a", "b"], [0.94, 1.5], [True, False])
    assert "1 of 2 inside" in alt
    assert "a: 0.94, fits; b: 1.50, outside x1.4, rejected for memory." in alt
