"""Memory per rank of a GPT-shaped transformer in each layout (chapter 11), from formulas.

- Parameters are counted from the shape: per block 12h² + 13h (q, k, v and the projection: 4h² + 4h;
  an MLP of width 4h: 8h² + 5h; two norms: 4h), a final norm (2h, counted with the blocks), a
  token embedding and an **untied** head of V·h each, as the course's GPT (position embeddings
  not counted: small, or none with rotary ones).
- Model states use ZeRO's accounting (``memory``: 16 bytes per parameter with mixed-precision
  Adam), divided as each layout divides the parameters.
- Activations use the per-layer formulas of Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models" (MLSys 2023, arXiv:2205.05198, Table 2): 16-bit
  activations and dropout masks, sequence s, micro-batch b, width h, a heads, tensor-parallel
  degree t:

      no tensor parallelism     s·b·h·(34 + 5·a·s/h)
      tensor parallel           s·b·h·(10 + 24/t + 5·a·s/(h·t))
      tensor + sequence par.    s·b·h·(34/t + 5·a·s/(h·t))

  With every block checkpointed (the paper's "full recomputation"), a block keeps only its
  input, 2·s·b·h bytes (divided by t with sequence parallelism), and the block being recomputed
  needs its whole activations once more during its backward.

The layouts on N processes with tensor-parallel degree t: ``ddp`` (N data-parallel replicas),
``fsdp`` (ZeRO-3 over N), ``tp`` (t-way TP, DDP over the N/t groups), ``tp+sp`` (the same with
sequence parallelism), ``2d`` (t-way TP with sequence parallelism, FSDP over the N/t groups);
``train_gpt.py``'s ``tp`` is the case t = N. Logits, temporary buffers and fragmentation are not
included, except the two buffers below that context and expert parallelism add.

**Context parallelism** (``cp`` = c) splits each sequence over c of the data ranks (the N/t
ranks that are not tensor-parallel partners: the mesh is dp × cp × tp, dp = N/(t·c), and the
micro-batch b is per dp rank, shared by its c context ranks). Each rank holds s/c positions:

- Parameters: none is split by c. ``ddp``, ``tp``, ``tp+sp`` replicate them over dp × cp (the
  gradients are all-reduced over both: the cp ranks saw other tokens); ``fsdp`` and ``2d`` shard
  them over dp × cp, as torchtitan does (its FSDP mesh is dp_shard × cp), which is all N/t ranks,
  as without cp. So the model states per rank do not change with c.
- Activations: every term of the table is per position, s/c of them. The attention term
  5·a·s²·b/t is the scores of the rank's s/c queries against all s keys, 5·a·(s/c)·s·b/t: so
  each formula above with its leading s replaced by s/c, the whole layer divided by c. (A fused
  attention keeps no scores at all; the course follows the table, as without cp.) This holds
  for a ring whose backward passes K and V around the ring again (Liu et al., "Ring Attention
  with Blockwise Transformers", arXiv:2310.01889; torch's ``_templated_ring_attention_backward``),
  so that a rank keeps only its own K and V. A ring written with plain autograd, as chapter 13a's
  ``context_parallel.ring_attention`` (its ``rotate`` is differentiable), keeps every block it
  received: K and V of the whole sequence, 4·s·b·h/t bytes per layer instead of 4·s·b·h/(c·t);
  its ``ring_flash_attention`` (the capstone's ``apply_cp``) keeps only its own.
  DeepSpeed-Ulysses (Jacobs et al., arXiv:2309.14509) keeps the same number of elements: inside
  attention each rank holds all s positions of a/c heads instead of s/c positions of all heads
  (it needs c to divide the a/t heads of a rank); its buffers are the all-to-all's, not modelled.
- Ring buffers (``ring_buffer_bytes``): while one layer's attention runs, K/V blocks are in
  flight, one being sent and one being received: forward 2 blocks × (K, V) × (s/c)·b·h/t
  elements, 8·s·b·h/(c·t) bytes; backward the same pair plus the dK/dV pair that travels with it
  back to its owner, 16·s·b·h/(c·t) bytes (in 16 bits; torch accumulates dQ, dK, dV in fp32,
  more). One layer at a time: the peak, 16·s·b·h/(c·t), counts once, not per layer. (torch
  2.13's ``context_parallel`` gathers K and V with an all-gather by default, the whole
  sequence's at once: ``_cp_options.rotate_method``; ``ALL_TO_ALL`` makes it a ring.)

**Expert parallelism** (``ep`` = e) with a mixture-of-experts MLP (``MoE``: E experts in every
block, as ``parallel_course.gpt.MoE``, a router Linear(h, E) without bias, each token sent to its
top-k experts, each expert with capacity ceil(C·tokens·k/E) slots, C the capacity factor: Switch
Transformer, Fedus et al., arXiv:2101.03961, and GShard, Lepikhin et al., arXiv:2006.16668):

- Parameters: a block's MLP becomes E experts of 8h² + 5h each and a router of h·E. The experts
  are divided by e (and by t in TP layouts: each expert is split like the dense MLP); the rest
  as without experts. e is taken out of the N/t data ranks, as in torchtitan; ``fsdp`` and
  ``2d`` shard each rank's E/e experts over the remaining N/(t·e) ranks, so with FSDP every
  parameter is still divided by N and e changes no model state there: what e saves is
  FSDP's gathering of the experts' weights.
- Activations: each of a rank's s·b/c tokens becomes k·C slots, filled or empty (empty slots are
  computed and kept all the same: that is C's price). Under e ranks each rank computes its E/e
  experts for the tokens of all e ranks, (E/e)·e·C·k·T/E = k·C·T slots with T its own tokens:
  **e divides no activation**. Per token, as the table counts the dense MLP (19·h bytes: input
  2h, GeLU input 8h, output 8h, dropout mask h), the MoE MLP keeps its input 2h and dropout
  mask h, the router's probabilities in fp32 (4·E bytes: Switch's selective precision), per
  choice the expert's output 2h that the gate multiplies (k of them), and per slot the expert's
  input 2h and GeLU input and output 16h: 3h + 4E + k·2h + k·C·18h bytes, in place of 19h. Under
  TP the 16h of a slot are divided by t; with sequence parallelism, everything. Measured (a
  unit test): the course's ``gpt.MLP`` keeps 36h bytes per token in fp32 and ``gpt.MoE`` 36h per
  slot, twice the 18h of 16 bits (the course has no dropout).
- Dispatch/combine buffer (``dispatch_buffer_bytes``): with e > 1 the slots go to their
  experts' ranks with an all-to-all; its receive buffer is the experts' input (kept, counted
  above), its send buffer, k·C·T slots of 2h bytes, exists only while the all-to-all runs (the
  combine's send buffer, backward's gradients: the same size, one at a time). Not with e = 1.

Per rank: ``buffers`` is the larger of the two (attention and MLP never run at once). With
c = e = 1 and no experts, every number is the one above, exactly.
``explorers.layout_memory`` draws these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import memory

LAYOUTS = ("ddp", "fsdp", "tp", "tp+sp", "2d")


@dataclass(frozen=True)
class Shape:
    """The shape of a GPT: blocks, width h, attention heads a, vocabulary V."""

    layers: int
    hidden: int
    heads: int
    vocab: int = 50257


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP in every block: E experts, top-k of them per token, capacity
    factor C (the defaults of ``parallel_course.gpt.GPTConfig``)."""

    experts: int
    top_k: int = 2
    capacity_factor: float = 1.25


SHAPES = {
    "GPT-2 small shape (12 x 768)": Shape(12, 768, 12),
    "GPT-2 XL shape (48 x 1600)": Shape(48, 1600, 25),
    "GPT-3 6.7B shape (32 x 4096)": Shape(32, 4096, 32),
    "GPT-3 13B shape (40 x 5120)": Shape(40, 5120, 40),
    "GPT-3 175B shape (96 x 12288)": Shape(96, 12288, 96),
}


def parameters(shape: Shape, moe: MoE | None = None) -> dict[str, int]:
    """Parameters by part: ``blocks``, ``embedding`` and ``head``; with experts, ``experts`` too
    (``blocks`` then holds the rest of the blocks: attention, norms, routers)."""
    h = shape.hidden
    if moe is None:
        return {
            "blocks": shape.layers * (12 * h * h + 13 * h) + 2 * h,
            "embedding": shape.vocab * h,
            "head": shape.vocab * h,
        }
    return {
        "blocks": shape.layers * (4 * h * h + 8 * h + h * moe.experts) + 2 * h,
        "experts": shape.layers * moe.experts * (8 * h * h + 5 * h),
        "embedding": shape.vocab * h,
        "head": shape.vocab * h,
    }


def _tensor_parallel(layout: str, tp: int) -> int:
    """The tensor-parallel degree a layout uses: ``ddp`` and ``fsdp`` none."""
    return 1 if layout in ("ddp", "fsdp") else tp


def _check(layout: str, world_size: int, tp: int, cp: int = 1, ep: int = 1, moe: MoE | None = None) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world_size < 1 or tp < 1 or world_size % tp:
        raise ValueError(f"the tensor-parallel degree {tp} must divide the {world_size} processes")
    data_ranks = world_size // _tensor_parallel(layout, tp)
    for name, degree in (("context", cp), ("expert", ep)):
        if degree < 1 or data_ranks % degree:
            raise ValueError(f"{layout}: the {name}-parallel degree {degree} must divide the {data_ranks} data ranks")
    if ep > 1 and moe is None:
        raise ValueError("expert parallelism needs experts (moe)")
    if moe is not None and (moe.experts < 1 or moe.experts % ep):
        raise ValueError(f"the expert-parallel degree {ep} must divide the {moe.experts} experts")


def parameters_per_rank(
    shape: Shape, layout: str, world_size: int, tp: int, cp: int = 1, ep: int = 1, moe: MoE | None = None
) -> float:
    """Parameters one rank stores. TP splits the blocks and the head by t, and the embedding too
    with sequence parallelism (as ``train_gpt.py --sequence-parallel``); FSDP splits what is left
    over its data-parallel ranks. Experts are split by e (and t), the rest as without them; cp
    splits nothing (only checked)."""
    _check(layout, world_size, tp, cp, ep, moe)
    p = parameters(shape, moe)
    experts = p.pop("experts", 0)
    t = _tensor_parallel(layout, tp)
    # Each rank's E/e experts, split by t, then sharded by FSDP over the data ranks left.
    expert_share = experts / (t * ep) / (world_size // (t * ep) if layout in ("fsdp", "2d") else 1)
    if layout == "ddp":
        return sum(p.values()) + expert_share
    if layout == "fsdp":
        return sum(p.values()) / world_size + expert_share
    sequence = layout in ("tp+sp", "2d")
    per_tp_rank = (p["blocks"] + p["head"]) / tp + (p["embedding"] / tp if sequence else p["embedding"])
    return (per_tp_rank / (world_size // tp) if layout == "2d" else per_tp_rank) + expert_share


def activation_bytes_per_layer(
    shape: Shape,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sequence: bool = False,
    cp: int = 1,
    moe: MoE | None = None,
) -> float:
    """Korthikanti et al.'s Table 2: bytes one block keeps for backward on one rank, for its s/c
    positions; with experts, the MoE MLP's 3h + 4E + k·2h + k·C·18h bytes per token, not 19h."""
    s, b, h, a, t = seq_len, micro_batch, shape.hidden, shape.heads, tp
    local = s / cp
    attention = 5 * a * s / (h * t)
    if moe is None:
        if sequence:
            return local * b * h * (34 / t + attention)
        return local * b * h * (10 + 24 / t + attention) if t > 1 else local * b * h * (34 + attention)
    # Attention and the two norms: 15h per token of the 34h (7h whole and 8h split under TP); the
    # MoE MLP's token part 3h + 4E + k·2h and its slots' 2h + 16h (whole and split under TP).
    k, slots = moe.top_k, moe.top_k * moe.capacity_factor
    if sequence:
        rest, mlp = 15 / t, (3 * h + 4 * moe.experts + k * 2 * h + slots * 18 * h) / t
    else:
        rest = 7 + 8 / t if t > 1 else 15
        mlp = 3 * h + 4 * moe.experts + k * 2 * h + slots * (2 * h + 16 * h / t)
    return local * b * h * (rest + attention) + local * b * mlp


def ring_buffer_bytes(shape: Shape, seq_len: int, micro_batch: int, tp: int = 1, cp: int = 1) -> float:
    """Ring attention's blocks in flight in one layer's backward (its peak): K, V and dK, dV, one
    of each sent and one received, 16·s·b·h/(c·t) bytes; 0 without context parallelism."""
    if cp == 1:
        return 0.0
    return 16 * seq_len / cp * micro_batch * shape.hidden / tp


def dispatch_buffer_bytes(
    shape: Shape,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sequence: bool = False,
    cp: int = 1,
    ep: int = 1,
    moe: MoE | None = None,
) -> float:
    """The all-to-all's send buffer of the MoE dispatch (or combine): k·C slots per token of the
    rank's s·b/c, 2h bytes each (divided by t with sequence parallelism); 0 with e = 1."""
    if moe is None or ep == 1:
        return 0.0
    slots = moe.top_k * moe.capacity_factor * seq_len / cp * micro_batch
    return 2 * slots * shape.hidden / (tp if sequence else 1)


def per_rank_bytes(
    shape: Shape,
    layout: str,
    world_size: int,
    tp: int,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool = False,
    precision: str = "mixed",
    cp: int = 1,
    ep: int = 1,
    moe: MoE | None = None,
) -> dict[str, float]:
    """Bytes on one rank: ``model states`` (weights, gradients, optimizer), ``activations`` and
    ``buffers`` (the larger of the ring's and the dispatch's, 0 with c = e = 1).
    ``micro_batch`` is per data-parallel rank: the global batch is micro_batch x N/c sequences for
    ``ddp`` and ``fsdp``, micro_batch x N/(t·c) for the others."""
    _check(layout, world_size, tp, cp, ep, moe)
    t = _tensor_parallel(layout, tp)
    sequence = layout in ("tp+sp", "2d")
    layer = activation_bytes_per_layer(shape, seq_len, micro_batch, t, sequence, cp, moe)
    if checkpointing:  # each block's input, and one block's activations while it is recomputed
        local = seq_len / cp
        activations = shape.layers * 2 * local * micro_batch * shape.hidden / (t if sequence else 1) + layer
    else:
        activations = shape.layers * layer
    states = parameters_per_rank(shape, layout, world_size, tp, cp, ep, moe) * memory.precision(precision).total
    buffers = max(
        ring_buffer_bytes(shape, seq_len, micro_batch, t, cp),
        dispatch_buffer_bytes(shape, seq_len, micro_batch, t, sequence, cp, ep, moe),
    )
    return {"model states": states, "activations": activations, "buffers": buffers}
