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
included.
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


SHAPES = {
    "GPT-2 small shape (12 x 768)": Shape(12, 768, 12),
    "GPT-2 XL shape (48 x 1600)": Shape(48, 1600, 25),
    "GPT-3 6.7B shape (32 x 4096)": Shape(32, 4096, 32),
    "GPT-3 13B shape (40 x 5120)": Shape(40, 5120, 40),
    "GPT-3 175B shape (96 x 12288)": Shape(96, 12288, 96),
}


def parameters(shape: Shape) -> dict[str, int]:
    """Parameters by part: ``blocks``, ``embedding`` and ``head``."""
    h = shape.hidden
    return {
        "blocks": shape.layers * (12 * h * h + 13 * h) + 2 * h,
        "embedding": shape.vocab * h,
        "head": shape.vocab * h,
    }


def _check(layout: str, world_size: int, tp: int) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world_size < 1 or tp < 1 or world_size % tp:
        raise ValueError(f"the tensor-parallel degree {tp} must divide the {world_size} processes")


def parameters_per_rank(shape: Shape, layout: str, world_size: int, tp: int) -> float:
    """Parameters one rank stores. TP splits the blocks and the head by t, and the embedding too
    with sequence parallelism (as ``train_gpt.py --sequence-parallel``); FSDP splits what is left
    over its data-parallel ranks."""
    _check(layout, world_size, tp)
    p = parameters(shape)
    if layout == "ddp":
        return sum(p.values())
    if layout == "fsdp":
        return sum(p.values()) / world_size
    sequence = layout in ("tp+sp", "2d")
    per_tp_rank = (p["blocks"] + p["head"]) / tp + (p["embedding"] / tp if sequence else p["embedding"])
    return per_tp_rank / (world_size // tp) if layout == "2d" else per_tp_rank


def activation_bytes_per_layer(
    shape: Shape, seq_len: int, micro_batch: int, tp: int = 1, sequence: bool = False
) -> float:
    """Korthikanti et al.'s Table 2: bytes one block keeps for backward on one rank."""
    s, b, h, a, t = seq_len, micro_batch, shape.hidden, shape.heads, tp
    attention = 5 * a * s / (h * t)
    if sequence:
        return s * b * h * (34 / t + attention)
    return s * b * h * (10 + 24 / t + attention) if t > 1 else s * b * h * (34 + attention)


def per_rank_bytes(
    shape: Shape,
    layout: str,
    world_size: int,
    tp: int,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool = False,
    precision: str = "mixed",
) -> dict[str, float]:
    """Bytes on one rank: ``model states`` (weights, gradients, optimizer) and ``activations``.
    ``micro_batch`` is per data-parallel rank: the global batch is micro_batch x N for ``ddp`` and
    ``fsdp``, micro_batch x N/t for the others."""
    _check(layout, world_size, tp)
    t = 1 if layout in ("ddp", "fsdp") else tp
    sequence = layout in ("tp+sp", "2d")
    layer = activation_bytes_per_layer(shape, seq_len, micro_batch, t, sequence)
    if checkpointing:  # each block's input, and one block's activations while it is recomputed
        activations = shape.layers * 2 * seq_len * micro_batch * shape.hidden / (t if sequence else 1) + layer
    else:
        activations = shape.layers * layer
    states = parameters_per_rank(shape, layout, world_size, tp) * memory.precision(precision).total
    return {"model states": states, "activations": activations}
