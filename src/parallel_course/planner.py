"""Plan a training run: memory per GPU, step time, tokens/s and MFU of a layout (chapter 14a).

The planner joins what earlier chapters model one at a time; it adds no new memory formula:

- **FLOPs** (``flops_per_token``): model FLOPs of forward + backward, 6 x the matmul weights a
  token uses plus attention's two matmuls, PaLM's convention (Chowdhery et al., "PaLM: Scaling
  Language Modeling with Pathways", 2022, arXiv:2204.02311, appendix B). **MFU** (model FLOPs
  utilisation, PaLM's definition) divides the model FLOPs a second delivers by the GPUs' peak:
  recomputation (activation checkpointing) costs time but adds no model FLOP. Megatron-LM's
  papers count it (Narayanan et al., SC21, arXiv:2104.04473, eq. 3: 96·B·s·l·h²(1 + s/6h +
  V/16lh) FLOPs per step, 4 forward passes of the blocks): ``hardware_flops_per_token``.
- **Memory** per GPU: ``transformer_memory.per_rank_bytes`` for one pipeline stage (its
  ``layers/pp`` blocks, with the embedding or the head, not both, when pp > 1), with the model
  states of ZeRO stages 1 and 2 from ``memory.per_rank_breakdown``; plus what a plan adds on
  top: the micro-batches a 1F1B stage holds at once (``min(pp, m)``, Narayanan et al.), FSDP's
  gathered layers and the logits (see ``memory_per_gpu``). Tensor parallelism always comes with
  sequence parallelism here (Korthikanti et al., arXiv:2205.05198), as in torchtitan.
- **Time**: compute = hardware FLOPs / (peak x efficiency), ``efficiency`` the fraction of peak
  the GPU's large matmuls reach (an input, stated per preset). Each axis communicates on its
  own link, with the α–β model of chapters 01 and 06a (``costmodel.message_time``) and the ring
  algorithms' step counts: all-reduce 2(n-1) steps of S/n, all-gather and reduce-scatter n-1
  steps of S/n, all-to-all n-1 messages of S/n. The mesh is ordered tp (innermost: neighbouring
  GPUs), cp, dp, pp (outermost), as Megatron-LM orders it; an axis whose group fits inside a
  node uses the intra-node link (NVLink), one that spans nodes the network, per GPU.
- **Overlap**: the gradient reduction of data parallelism can hide behind the backward of the
  last micro-batch (earlier micro-batches accumulate without syncing: ``no_sync``), FSDP's
  gathers and the ring of context parallelism behind the compute they prefetch for; tensor
  parallelism's collectives, the experts' all-to-alls and the pipeline's sends sit on the
  critical path between layers and are counted in full. The **bubble** of 1F1B is chapter 07a's
  (p-1)/(m+p-1) of the step (``model_parallel.bubble_fraction``).

Not modelled: the optimizer step, data loading, kernel launch overheads, stragglers, load
imbalance between experts, contention when several axes share a link, and memory
fragmentation (``usable`` keeps a margin for it and for the CUDA context).
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
from dataclasses import dataclass, field, replace

from . import memory
from . import transformer_memory as tm
from .costmodel import message_time
from .model_parallel import bubble_fraction

GB = memory.GB


def flops_per_token(
    *,
    layers: int,
    hidden: int,
    seq_len: int,
    vocab: int,
    ffn: int | None = None,
    moe_experts: int = 0,
    top_k: int = 1,
    attention: bool = True,
) -> float:
    """Model FLOPs of forward + backward for one token: 3 x the forward's.

    A matmul with a weight of n parameters costs 2n FLOPs per token forward (one multiply, one
    add) and twice that backward (the gradients of its input and of its weight): 6n in all. The
    weights a token passes through: per block q, k, v and the output projection (4h²) and the
    MLP (2·h·ffn; with experts, its top-k experts' MLPs and the router's h·E), and the output
    head (V·h). Embedding lookups and biases are not matmuls and are not counted. Attention's
    two matmuls (scores Q·Kᵀ and the weighted sum of V) add 2·2·s·h per token and layer forward,
    12·layers·h·s for training, counting the whole s x s square as PaLM does (a causal kernel
    skips half of it: PaLM's convention counts it anyway, and so does Megatron's formula).
    """
    for name, value in (("layers", layers), ("hidden", hidden), ("seq_len", seq_len), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    ffn = 4 * hidden if ffn is None else ffn
    if moe_experts < 0 or top_k < 1 or (moe_experts and top_k > moe_experts):
        raise ValueError(f"need 0 < top_k <= moe_experts (or no experts), got {top_k} of {moe_experts}")
    mlp = 2 * hidden * ffn * (top_k if moe_experts else 1) + hidden * moe_experts
    matmul_params = layers * (4 * hidden * hidden + mlp) + vocab * hidden
    attention_flops = 12 * layers * hidden * seq_len if attention else 0
    return float(6 * matmul_params + attention_flops)


# --- what is planned: a model, a cluster, a layout -------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A GPT: ``layers`` blocks of width ``hidden`` with ``heads`` heads, vocabulary ``vocab``,
    trained on sequences of ``seq_len``; an MLP of width ``ffn`` (4h), or ``moe_experts`` such
    MLPs of which each token uses ``top_k``, each with capacity factor ``capacity_factor``."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn: int | None = None
    moe_experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.25

    @property
    def shape(self) -> tm.Shape:
        return tm.Shape(self.layers, self.hidden, self.heads, self.vocab)

    @property
    def moe(self) -> tm.MoE | None:
        return tm.MoE(self.moe_experts, self.top_k, self.capacity_factor) if self.moe_experts else None

    def params(self) -> int:
        """Parameters, counted as ``transformer_memory.parameters`` counts them (untied head, no
        position embeddings), for any MLP width."""
        h, f, e = self.hidden, self.ffn or 4 * self.hidden, self.moe_experts
        mlp = 2 * h * f + f + h  # two Linear layers with their biases
        block = 4 * h * h + 4 * h + 4 * h + (e * mlp + h * e if e else mlp)
        return self.layers * block + 2 * h + 2 * self.vocab * h

    def flops_per_token(self, attention: bool = True) -> float:
        """Model FLOPs of forward + backward per token (``flops_per_token``)."""
        return flops_per_token(
            layers=self.layers,
            hidden=self.hidden,
            seq_len=self.seq_len,
            vocab=self.vocab,
            ffn=self.ffn,
            moe_experts=self.moe_experts,
            top_k=self.top_k,
            attention=attention,
        )

    def hardware_flops_per_token(self, checkpointing: bool) -> float:
        """FLOPs a GPU executes per token: the model FLOPs, with the experts' empty slots (each
        expert computes its whole capacity, C x the tokens routed to it) and, with every block
        checkpointed, one more forward of the blocks (Megatron's 4 passes instead of 3)."""
        total = self.flops_per_token()
        head = 6 * self.vocab * self.hidden
        if self.moe_experts:
            experts = 6 * self.layers * 2 * self.hidden * (self.ffn or 4 * self.hidden) * self.top_k
            total += experts * (self.capacity_factor - 1)
        if checkpointing:
            total += (total - head) / 3
        return total


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs of ``memory_bytes`` and ``peak_flops`` (dense 16-bit),
    links (α seconds, β bytes/s per GPU and direction) inside a node and between nodes, and
    ``efficiency``, the fraction of peak that large matmuls reach."""

    name: str
    gpus_per_node: int
    nodes: int
    memory_bytes: float
    peak_flops: float
    intra: tuple[float, float]
    inter: tuple[float, float]
    efficiency: float = 0.55

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Layout:
    """Degrees of data (dp), tensor (tp, with sequence parallelism), pipeline (pp, 1F1B),
    context (cp) and expert (ep, taken out of the dp x cp data ranks) parallelism; the ZeRO
    stage of the data-parallel ranks (0: DDP, 3: FSDP); the micro-batch (sequences per
    data-parallel rank and forward); whether every block is checkpointed."""

    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    checkpointing: bool = False

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def __str__(self) -> str:
        # Degrees of 1 left out: "dp=16 tp=4 zero=1 b=2" reads faster than every axis spelled out.
        degrees = (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep))
        axes = "".join(f" {n}={v}" for n, v in degrees if v != 1)
        ckpt = " ckpt" if self.checkpointing else ""
        return f"dp={self.dp}{axes} zero={self.zero} b={self.micro_batch}{ckpt}"


# Where each preset's numbers come from:
# - A100 SXM 80GB: 312 TFLOP/s dense bf16 and NVLink 600 GB/s both directions (300 per direction),
#   the NVIDIA A100 data sheet, as chapter 06a quotes it; 80 GB taken as 80e9 bytes. Between
#   nodes a DGX A100 has one 200 Gb/s HDR InfiniBand adapter per GPU (NVIDIA DGX A100 user
#   guide; Selene, the cluster of Narayanan et al., SC21 section 5): 25 GB/s per GPU.
# - H100 SXM 80GB: 989 TFLOP/s dense bf16 and NVLink 900 GB/s both directions (450 per direction),
#   the NVIDIA H100 data sheet (chapter 06a); a DGX H100 has one 400 Gb/s NDR adapter per GPU
#   (NVIDIA DGX H100 user guide): 50 GB/s per GPU.
# - α: a few microseconds inside a node, about 10 between nodes: the order of NCCL's small-message
#   latency (an assumption of this model, not a data-sheet figure; chapter 06a fits it on a
#   real machine).
# - efficiency 0.55: chosen once so that Narayanan et al.'s SC21 Table 1 (ten GPT models on up to 3072
#   A100s) comes out within 25% on every row with this one value (tests/unit/test_planner.py); the
#   H100 preset takes the same value, for want of a published table to calibrate it on.
CLUSTERS = {
    "a100-80gb": Cluster("a100-80gb", 8, 1, 80e9, 312e12, (5e-6, 300e9), (10e-6, 25e9), 0.55),
    "h100-80gb": Cluster("h100-80gb", 8, 1, 80e9, 989e12, (5e-6, 450e9), (10e-6, 50e9), 0.55),
}

# GPT-3's shapes (Brown et al. 2020, Table 2.1), sequence 2048, GPT-2's vocabulary; the 13B model's
# width is 5120 (40 heads of 128: the parameter count of Table D.1 needs 5120; Table 2.1 prints 5140).
# Counted as the course's GPT counts them: untied head, no position embeddings.
MODELS = {
    "gpt3-125m": Model("gpt3-125m", 12, 768, 12, 50257, 2048),
    "gpt3-350m": Model("gpt3-350m", 24, 1024, 16, 50257, 2048),
    "gpt3-760m": Model("gpt3-760m", 24, 1536, 16, 50257, 2048),
    "gpt3-1.3b": Model("gpt3-1.3b", 24, 2048, 24, 50257, 2048),
    "gpt3-2.7b": Model("gpt3-2.7b", 32, 2560, 32, 50257, 2048),
    "gpt3-6.7b": Model("gpt3-6.7b", 32, 4096, 32, 50257, 2048),
    "gpt3-13b": Model("gpt3-13b", 40, 5120, 40, 50257, 2048),
    "gpt3-175b": Model("gpt3-175b", 96, 12288, 96, 50257, 2048),
    # A mixture of experts: the 1.3B shape with 64 experts per block, top-2 (GShard/Switch style).
    "moe-1.3b-64e": Model("moe-1.3b-64e", 24, 2048, 24, 50257, 2048, moe_experts=64, top_k=2),
}


def cluster(name: str, nodes: int = 1) -> Cluster:
    """A preset with ``nodes`` nodes."""
    if name not in CLUSTERS:
        raise ValueError(f"cluster must be one of {sorted(CLUSTERS)}, got {name!r}")
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    return replace(CLUSTERS[name], nodes=nodes)


def model(name: str, seq_len: int | None = None) -> Model:
    """A preset, optionally with another sequence length."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name] if seq_len is None else replace(MODELS[name], seq_len=seq_len)


# --- memory ------------------------------------------------------------------------------------------


def _tm_layout(layout: Layout) -> str:
    """The ``transformer_memory`` layout that shards as this one does (ZeRO-3 = FSDP)."""
    if layout.tp == 1:
        return "fsdp" if layout.zero == 3 else "ddp"
    return "2d" if layout.zero == 3 else "tp+sp"


def _stage(m: Model, layout: Layout) -> tm.Shape:
    return tm.Shape(math.ceil(m.layers / layout.pp), m.hidden, m.heads, m.vocab)


def stage_parameters(m: Model, layout: Layout) -> float:
    """Parameters one GPU holds before ZeRO shards anything (ZeRO-3: after, as FSDP shards them):
    ``transformer_memory.parameters_per_rank`` of one pipeline stage, whose ``layers/pp`` blocks
    come with the embedding (first stage) or the head (last stage), not both, when pp > 1. With
    sequence parallelism the embedding and the head are divided alike, so the one left out is
    half of what the vocabulary adds."""
    tm_layout = _tm_layout(layout if layout.zero == 3 else replace(layout, zero=0))
    world, shape = layout.dp * layout.cp * layout.tp, _stage(m, layout)
    args = (tm_layout, world, layout.tp, layout.cp, layout.ep, m.moe)
    per_rank = tm.parameters_per_rank(shape, *args)
    if layout.pp > 1:
        without_vocab = tm.parameters_per_rank(replace(shape, vocab=0), *args)
        per_rank -= (per_rank - without_vocab) / 2
    return per_rank


def memory_per_gpu(m: Model, layout: Layout, micro_batches: int = 1) -> dict[str, float]:
    """Bytes on the busiest GPU (the first pipeline stage), by part:

    - ``model states``: weights, gradients and Adam's states of ``stage_parameters`` (16 bytes
      per parameter in mixed precision), ZeRO-1 and 2 dividing theirs over the dp x cp / ep
      ranks that hold the same parameters (``memory.per_rank_breakdown``), ZeRO-3 as FSDP.
    - ``activations``: ``transformer_memory``'s for the stage's blocks, times the micro-batches
      a 1F1B stage holds at once, min(pp, m); with checkpointing the block being recomputed counts
      once.
    - ``buffers``: ``transformer_memory``'s ring or all-to-all buffers; with ZeRO-3, two gathered
      blocks in 16 bits (the one computing and the one prefetched).
    - ``logits``: the last layer's output and its gradient in fp32, s/cp·b·V/tp values each.
    """
    if (m.ffn or 4 * m.hidden) != 4 * m.hidden:
        raise ValueError("the memory formulas (Korthikanti et al.) assume an MLP of width 4h")
    shape, world = _stage(m, layout), layout.dp * layout.cp * layout.tp
    tm_layout = _tm_layout(layout)
    parts = tm.per_rank_bytes(
        shape,
        tm_layout,
        world,
        layout.tp,
        m.seq_len,
        layout.micro_batch,
        layout.checkpointing,
        cp=layout.cp,
        ep=layout.ep,
        moe=m.moe,
    )
    params = stage_parameters(m, layout)
    if layout.zero in (1, 2):
        group = layout.dp * layout.cp // layout.ep
        states = memory.per_rank_bytes(params, group, layout.zero)
    else:
        states = params * memory.precision("mixed").total
    in_flight = min(layout.pp, micro_batches) if layout.pp > 1 else 1
    activations = parts["activations"]
    if layout.checkpointing:
        layer = tm.activation_bytes_per_layer(
            shape, m.seq_len, layout.micro_batch, layout.tp, layout.tp > 1, layout.cp, m.moe
        )
        activations = in_flight * (activations - layer) + layer
    else:
        activations *= in_flight
    buffers = parts["buffers"]
    if layout.zero == 3:
        block = tm.parameters_per_rank(
            tm.Shape(1, m.hidden, m.heads, 0), "tp+sp" if layout.tp > 1 else "ddp", layout.tp, layout.tp
        )
        block_experts = 0.0
        if m.moe:
            block_experts = m.moe_experts * (8 * m.hidden**2 + 5 * m.hidden) / (layout.tp * layout.ep)
            block = (4 * m.hidden**2 + 8 * m.hidden + m.hidden * m.moe_experts) / layout.tp
        buffers += 2 * 2 * (block + block_experts)
    logits = 2 * 4 * m.seq_len / layout.cp * layout.micro_batch * m.vocab / layout.tp
    return {"model states": states, "activations": activations, "buffers": buffers, "logits": logits}


# --- time --------------------------------------------------------------------------------------------


def all_reduce_s(nbytes: float, n: int, link: tuple[float, float]) -> float:
    """Ring all-reduce of ``nbytes`` over n ranks: 2(n-1) steps of nbytes/n (chapter 01)."""
    return 0.0 if n == 1 else 2 * (n - 1) * message_time(nbytes / n, link[1], link[0])


def all_gather_s(nbytes: float, n: int, link: tuple[float, float]) -> float:
    """Ring all-gather (or reduce-scatter) of ``nbytes`` in all: n-1 steps of nbytes/n."""
    return 0.0 if n == 1 else (n - 1) * message_time(nbytes / n, link[1], link[0])


def all_to_all_s(nbytes: float, n: int, link: tuple[float, float]) -> float:
    """All-to-all of a send buffer of ``nbytes``: n-1 messages of nbytes/n, one after another."""
    return 0.0 if n == 1 else (n - 1) * message_time(nbytes / n, link[1], link[0])


def links(c: Cluster, layout: Layout) -> dict[str, str]:
    """``"intra"`` or ``"inter"`` for each axis: the mesh is tp (innermost), cp, dp, pp; ep lies
    inside the data ranks, next to tp. An axis whose ranks all share a node uses the intra-node
    link."""
    spans = {
        "tp": layout.tp,
        "cp": layout.tp * layout.cp,
        "ep": layout.tp * layout.ep,
        "dp": layout.tp * layout.cp * layout.dp,
        "pp": layout.gpus,
    }
    return {axis: "intra" if span <= c.gpus_per_node else "inter" for axis, span in spans.items()}


@dataclass
class Plan:
    """A layout's prediction; times in seconds per optimizer step, bytes per GPU."""

    model: Model
    cluster: Cluster
    layout: Layout
    global_batch: int
    micro_batches: int
    memory: dict[str, float]
    compute_s: float
    comm_s: dict[str, float]
    hidden_s: float
    bubble_s: float
    links: dict[str, str]
    problems: list[str] = field(default_factory=list)

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def exposed_comm_s(self) -> float:
        return sum(self.comm_s.values()) - self.hidden_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.bubble_s

    @property
    def tokens_per_s(self) -> float:
        return self.global_batch * self.model.seq_len / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs per second over the peak of every GPU the layout uses (PaLM's MFU)."""
        return self.tokens_per_s * self.model.flops_per_token() / (self.layout.gpus * self.cluster.peak_flops)

    @property
    def hardware_flops_per_gpu(self) -> float:
        """FLOP/s one GPU executes, recomputation and empty expert slots included (what
        Megatron-LM's papers report as "achieved teraFLOP/s per GPU")."""
        per_token = self.model.hardware_flops_per_token(self.layout.checkpointing)
        return self.tokens_per_s * per_token / self.layout.gpus

    def summary(self) -> str:
        """The plan as aligned lines (GB = 10^9 bytes)."""
        head = f"{self.model.name} on {self.layout.gpus} GPUs ({self.cluster.name}): {self.layout}"
        if self.compute_s == math.inf:
            return f"{head}\n  cannot run: " + "; ".join(self.problems)
        mem = ", ".join(f"{k} {v / GB:.1f}" for k, v in self.memory.items())
        comm = ", ".join(f"{k} {1e3 * v:.0f} ms ({self.links[k]})" for k, v in self.comm_s.items() if v)
        lines = [
            f"{head}, {self.micro_batches} micro-batches of {self.layout.micro_batch}",
            f"  memory per GPU  {self.memory_bytes / GB:6.1f} GB of {self.cluster.memory_bytes / GB:.0f} ({mem})",
            f"  compute         {1e3 * self.compute_s:8.0f} ms",
            f"  communication   {1e3 * sum(self.comm_s.values()):8.0f} ms, {1e3 * self.hidden_s:.0f} ms of it hidden"
            + (f" ({comm})" if comm else ""),
            f"  bubble          {1e3 * self.bubble_s:8.0f} ms",
            f"  step            {1e3 * self.step_s:8.0f} ms: {self.tokens_per_s:,.0f} tokens/s, MFU {self.mfu:.1%}",
        ]
        lines.append("  feasible" if self.fits else "  rejected: " + "; ".join(self.problems))
        return "\n".join(lines)


def check_layout(m: Model, c: Cluster, layout: Layout, global_batch: int) -> list[str]:
    """Why a layout cannot run at all, each reason a short phrase (``plan`` adds the layouts that
    run but should not: out of memory, tensor parallelism across nodes)."""
    problems = []
    if min(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.micro_batch) < 1:
        problems.append("every degree and the micro-batch must be >= 1")
        return problems
    if layout.zero not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage {layout.zero} is not 0..3")
    if layout.gpus > c.gpus:
        problems.append(f"needs {layout.gpus} GPUs, the cluster has {c.gpus}")
    if m.heads % layout.tp:
        problems.append(f"tp={layout.tp} does not divide the {m.heads} heads")
    if m.layers % layout.pp:
        problems.append(f"pp={layout.pp} does not divide the {m.layers} layers")
    if m.seq_len % layout.cp:
        problems.append(f"cp={layout.cp} does not divide the sequence of {m.seq_len}")
    if layout.ep > 1 and not m.moe_experts:
        problems.append(f"ep={layout.ep} needs experts")
    elif layout.ep > 1 and (m.moe_experts % layout.ep or (layout.dp * layout.cp) % layout.ep):
        problems.append(f"ep={layout.ep} must divide the {m.moe_experts} experts and the dp x cp ranks")
    if global_batch % (layout.dp * layout.micro_batch):
        problems.append(f"the batch of {global_batch} is not a multiple of dp x micro-batch")
    return problems


def plan(m: Model, c: Cluster, layout: Layout, global_batch: int, usable: float = 0.9) -> Plan:
    """Predict one layout (see the module's docstring). ``global_batch`` is in sequences; a GPU
    may use ``usable`` of its memory (the rest: CUDA context, fragmentation)."""
    problems = check_layout(m, c, layout, global_batch)
    axes = ("tp", "cp", "ep", "dp", "pp")
    if problems:
        no_time = dict.fromkeys(axes, 0.0)
        return Plan(m, c, layout, global_batch, 0, {}, math.inf, no_time, 0.0, 0.0, links(c, layout), problems)
    t, p, cp, ep, b = layout.tp, layout.pp, layout.cp, layout.ep, layout.micro_batch
    micro_batches = global_batch // (layout.dp * b)
    mem = memory_per_gpu(m, layout, micro_batches)
    if layout.tp > c.gpus_per_node:
        problems.append(f"tp={layout.tp} spans nodes: its collectives in every layer would cross the network")
    if sum(mem.values()) > usable * c.memory_bytes:
        problems.append(
            f"needs {sum(mem.values()) / GB:.0f} GB per GPU, {usable:.0%} of {c.memory_bytes / GB:.0f} GB is usable"
        )

    link = {axis: c.intra if where == "intra" else c.inter for axis, where in links(c, layout).items()}
    tokens = global_batch * m.seq_len
    compute = tokens * m.hardware_flops_per_token(layout.checkpointing) / layout.gpus
    compute_s = compute / (c.peak_flops * c.efficiency)
    per_mb_s = compute_s / micro_batches
    stage_layers = m.layers // p
    # A micro-batch's activation on one rank, 16 bits: s/cp positions x b x h.
    act = 2 * m.seq_len / cp * b * m.hidden
    passes = 3 if layout.checkpointing else 2  # forward (+ recomputed forward) and backward

    comm = dict.fromkeys(axes, 0.0)
    # tp with sequence parallelism: per block two all-gathers and two reduce-scatters forward and
    # backward, as much as 2 all-reduces per pass (Korthikanti et al., section 4.2.2).
    comm["tp"] = micro_batches * stage_layers * 2 * passes * all_reduce_s(act, t, link["tp"])
    # cp ring: c-1 steps passing K and V forward (and recomputing), K, V, dK, dV backward.
    kv = 2 * act / t
    ring = (passes - 1) * (cp - 1) * message_time(kv, link["cp"][1], link["cp"][0])
    ring += (cp - 1) * message_time(2 * kv, link["cp"][1], link["cp"][0])
    comm["cp"] = micro_batches * stage_layers * ring if cp > 1 else 0.0
    # ep: dispatch and combine all-to-alls per MoE block and pass, k·C slots per token.
    if ep > 1:
        slots = m.top_k * m.capacity_factor * act / t
        comm["ep"] = micro_batches * stage_layers * 2 * passes * all_to_all_s(slots, ep, link["ep"])
    # dp: the gradients of the rank's parameters in 16 bits over the dp x cp ranks.
    n_dp = layout.dp * cp
    grads = 2 * stage_parameters(m, replace(layout, zero=0))
    gathers = 0.0
    if layout.zero == 3:
        # FSDP: all-gather the weights forward and again backward in every micro-batch; reduce-
        # scatter the gradients once per step (accumulating unsharded in between).
        gathers = micro_batches * 2 * all_gather_s(grads, n_dp, link["dp"])
        reduce = all_gather_s(grads, n_dp, link["dp"])
    else:
        # DDP, ZeRO-1 and 2: an all-reduce, or a reduce-scatter and an all-gather, the same bytes.
        reduce = all_reduce_s(grads, n_dp, link["dp"])
    comm["dp"] = gathers + reduce
    # pp: each micro-batch's activation forward and its gradient backward, on the critical path.
    if p > 1:
        comm["pp"] = 2 * (micro_batches + p - 1) * message_time(act / t, link["pp"][1], link["pp"][0])

    # What hides: the gradient reduction behind the last micro-batch's backward; FSDP's gathers
    # and the cp ring behind the compute they prefetch for.
    backward_share = 3 / 4 if layout.checkpointing else 2 / 3
    hidden = min(reduce, backward_share * per_mb_s) + min(gathers + comm["cp"], compute_s)
    hidden = min(hidden, compute_s)
    exposed_per_mb = (comm["tp"] + comm["ep"]) / micro_batches
    f = bubble_fraction(p, micro_batches)
    bubble_s = f / (1 - f) * (per_mb_s + exposed_per_mb) * micro_batches if p > 1 else 0.0
    return Plan(
        m, c, layout, global_batch, micro_batches, mem, compute_s, comm, hidden, bubble_s, links(c, layout), problems
    )


# --- search ------------------------------------------------------------------------------------------


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def search(
    m: Model,
    c: Cluster,
    global_batch: int,
    *,
    tps=None,
    pps=None,
    cps=(1,),
    eps=None,
    zeros=(0, 1, 2, 3),
    micro_batches=(1, 2, 4, 8),
    checkpointing=(False, True),
    usable: float = 0.9,
) -> tuple[list[Plan], list[Plan]]:
    """Every layout that uses all of the cluster's GPUs: (feasible plans, fastest first; the
    others, each with its ``problems``). Degrees are powers of two unless given."""
    # Also degrees that fail (tp across nodes, pp not dividing the layers): their reasons teach.
    tps = tps or _powers_of_two(min(2 * c.gpus_per_node, c.gpus))
    pps = pps or _powers_of_two(c.gpus)
    eps = eps or (_powers_of_two(min(m.moe_experts, c.gpus)) if m.moe_experts else [1])
    feasible, rejected = [], []
    for tp, pp, cp, ep, zero, b, ckpt in itertools.product(tps, pps, cps, eps, zeros, micro_batches, checkpointing):
        dp, rest = divmod(c.gpus, tp * pp * cp)
        if rest or dp < 1:
            continue
        p = plan(m, c, Layout(dp, tp, pp, cp, ep, zero, b, ckpt), global_batch, usable)
        (feasible if p.fits else rejected).append(p)
    feasible.sort(key=lambda p: (p.step_s, p.memory_bytes))
    return feasible, rejected


def rejection_summary(rejected: list[Plan], examples: int = 1) -> list[str]:
    """One line per kind of reason (a plan's first reason, its numbers left out), most common
    first: how many layouts, and ``examples`` of them with their reason."""
    groups: dict[str, list[Plan]] = {}
    for p in rejected:
        groups.setdefault(re.sub(r"\d+", "N", p.problems[0]), []).append(p)
    lines = []
    for plans in sorted(groups.values(), key=lambda plans: -len(plans)):
        for p in plans[:examples]:
            lines.append(f"{len(plans):5} layouts like {p.layout}: {p.problems[0]}")
    return lines


def table(plans: list[Plan]) -> list[str]:
    """Ranked plans as aligned lines."""
    lines = [f"{'layout':36} {'GB/GPU':>7} {'step':>9} {'tokens/s':>10} {'MFU':>6}  exposed comm, bubble"]
    for p in plans:
        lines.append(
            f"{str(p.layout):36} {p.memory_bytes / GB:7.1f} {1e3 * p.step_s:7.0f} ms {p.tokens_per_s:10,.0f}"
            f" {p.mfu:6.1%}  {1e3 * p.exposed_comm_s:.0f} ms, {1e3 * p.bubble_s:.0f} ms"
        )
    return lines


# --- command line ------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parallel_course.planner",
        description="Rank the layouts of a GPT on a cluster by predicted step time; say why the others fail.",
        epilog=f"models: {', '.join(MODELS)}; clusters: {', '.join(CLUSTERS)}",
    )
    parser.add_argument("--model", default="gpt3-6.7b", help="a model preset (see below)")
    parser.add_argument("--cluster", default="a100-80gb", help="a cluster preset (see below)")
    parser.add_argument("--nodes", type=int, default=8, help="nodes of the cluster (8 GPUs each)")
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per optimizer step")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    parser.add_argument("--cp", type=int, nargs="+", default=[1], help="context-parallel degrees to try")
    parser.add_argument("--top", type=int, default=5, help="how many feasible layouts to print")
    args = parser.parse_args(argv)
    try:
        if args.top < 1 or args.global_batch < 1:
            raise ValueError("--top and --global-batch must be >= 1")
        m, c = model(args.model, args.seq_len), cluster(args.cluster, args.nodes)
        if any(cp < 1 or c.gpus % cp for cp in args.cp):
            raise ValueError(f"every --cp must divide the cluster's {c.gpus} GPUs, got {args.cp}")
        feasible, rejected = search(m, c, args.global_batch, cps=tuple(args.cp))
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(
        f"{m.name}: {m.params() / 1e9:.2f} B parameters, {m.flops_per_token() / 1e9:.1f} GFLOP per token; "
        f"{c.gpus} x {c.name}; global batch {args.global_batch} x {m.seq_len} tokens"
    )
    print(f"{len(feasible)} feasible layouts, best first:")
    print("\n".join(table(feasible[: args.top])))
    if feasible:
        print("\nthe best in detail:\n" + feasible[0].summary())
    print(f"\n{len(rejected)} rejected, by reason:")
    print("\n".join(rejection_summary(rejected)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
