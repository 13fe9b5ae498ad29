"""Plan a training run: memory per GPU, step time, tokens/s and MFU of a layout (chapter 14a).

The model of a step, part by part (each part has its function below; 14a shows them):

- **FLOPs** (``flops_per_token``): model FLOPs of forward + backward, 6 x the matmul weights a
  token uses plus attention's two matmuls over the whole s x s square, PaLM's convention
  (Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways", 2022, arXiv:2204.02311,
  appendix B). **MFU** (model FLOPs utilisation, PaLM's definition) divides the model FLOPs a
  second delivers by the GPUs' dense 16-bit data-sheet peak. What a GPU *executes*
  (``Model.hardware_flops_per_token``) differs: recomputation adds forward passes (Megatron-LM's
  papers count them: Narayanan et al., SC21, arXiv:2104.04473, eq. 3), the experts compute their
  empty slots, and FlashAttention skips the masked half of a causal square but recomputes Q·Kᵀ in
  its backward (Dao, "FlashAttention-2", arXiv:2307.08691): 7·s·h FLOPs per token and layer
  where PaLM counts 12·s·h.
- **Memory** per GPU, stage by stage (the busiest is reported): weights, gradients and Adam's
  states (ZeRO's accounting, ``memory``: 2 + 2 + 12 bytes per parameter, divided as the ZeRO stage
  divides them); the activations a block keeps for backward (``activation_bytes_per_layer``: what
  autograd saves, term by term, Korthikanti et al., arXiv:2205.05198, Table 2, generalised to
  FlashAttention, grouped-query attention, SwiGLU and no dropout) times the micro-batches a stage
  holds at once under 1F1B or the interleaved schedule; the logits; the buffers of FSDP's
  gathers, of the ring of context parallelism and of the experts' all-to-all.
- **Time**: compute = executed FLOPs / (peak x efficiency), ``efficiency`` the fraction of peak
  large matmuls reach (one number per preset, fitted once on SC21's Table 1). Each axis
  communicates over its own link with the α–β model of chapters 01 and 06a and the ring's step
  counts. The mesh is ordered tp (innermost), cp, dp, pp, as Megatron-LM orders it. A group inside
  a node uses NVLink; a group that spans nodes is limited by the **bytes that cross each node
  boundary**: NCCL's rings enter and leave every node once per channel, and the channels are
  spread over the node's NICs, so a ring all-reduce of S bytes carries 2(n-1)/n·S over each
  boundary whatever the number of the group's GPUs in the node; the node's NICs are shared by the
  groups that run at once (``network_share``).
- **Overlap**: the gradient reduction can hide behind backward (the last micro-batch's, or each
  micro-batch's when ZeRO-2/3 reduce-scatters every micro-batch), FSDP's gathers and the ring of
  context parallelism behind the compute they prefetch for; tensor parallelism's collectives, the
  experts' all-to-alls and the pipeline's sends sit on the critical path and count in full.
- **Pipeline**: stages need not divide the layers: the extra layers go to the inner stages, the
  first and last stages (which also hold the embedding and the head) get fewer, as Llama 3 and
  BLOOM balanced theirs. The slowest stage sets the pace; the bubble is (p-1)/v of its
  micro-batch time, with v chunks per rank for the interleaved schedule (Narayanan et al., SC21,
  section 2.2.2; 1F1B is v = 1).

Not modelled: the optimizer step, data loading, kernel launch overheads, stragglers, load
imbalance between experts, contention when several axes share a link, NCCL's tree and in-network
(SHARP) algorithms, fp32 gradient accumulation and reduction (Megatron-LM, BLOOM and Llama 3 keep
their accumulated gradients in fp32: 2 more bytes per parameter, twice the gradient bytes),
Megatron's scatter/gather of pipeline messages, a framework's buffers, the CUDA context and memory
fragmentation (``usable`` keeps a margin for them), and every trick a team adds that is not one of
the layout's keys (Llama 3's stage-boundary tensors freed early, for one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from dataclasses import dataclass, field, fields, replace

from . import memory
from .costmodel import message_time

GB = memory.GB

MLPS = ("gelu", "swiglu")
RECOMPUTE = ("none", "selective", "selective-op", "full")
ATTENTION = ("flash", "naive")
ACCUMULATE = ("sharded", "full")
LOSS = ("parallel", "replicated", "chunked")
# Tokens whose logits a chunked loss materialises at once (the chunk of a fused or chunked
# cross-entropy, as Liger-Kernel's and torchtune's compute it).
LOSS_CHUNK = 1024


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
    heads: int | None = None,
    kv_heads: int | None = None,
    mlp: str = "gelu",
) -> float:
    """Model FLOPs of forward + backward for one token: 3 x the forward's.

    A matmul with a weight of n parameters costs 2n FLOPs per token forward (one multiply, one
    add) and twice that backward (the gradients of its input and of its weight): 6n in all. The
    weights a token passes through: per block q and the output projection (h² each), k and v
    (h·h_kv each: with grouped-query attention h_kv = h·kv_heads/heads, else h), the MLP (2·h·ffn
    for GELU's two matrices, 3·h·ffn for SwiGLU's three; with experts, its top-k experts' MLPs and
    the router's h·E), and the output head (V·h, tied to the embedding or not: it is a matmul
    either way). Embedding lookups and biases are not matmuls and are not counted. Attention's two
    matmuls (scores Q·Kᵀ and the weighted sum of V) add 2·2·s·h per token and layer forward,
    12·layers·h·s for training, counting the whole s x s square as PaLM does (a causal kernel
    skips half of it: PaLM's convention counts it anyway, and so does Megatron's formula).
    """
    for name, value in (("layers", layers), ("hidden", hidden), ("seq_len", seq_len), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if mlp not in MLPS:
        raise ValueError(f"mlp must be one of {MLPS}, got {mlp!r}")
    ffn = 4 * hidden if ffn is None else ffn
    if moe_experts < 0 or top_k < 1 or (moe_experts and top_k > moe_experts):
        raise ValueError(f"need 0 < top_k <= moe_experts (or no experts), got {top_k} of {moe_experts}")
    kv = hidden if kv_heads is None or heads is None else hidden * kv_heads // heads
    matrices = 2 if mlp == "gelu" else 3
    block_mlp = matrices * hidden * ffn * (top_k if moe_experts else 1) + hidden * moe_experts
    matmul_params = layers * (2 * hidden * hidden + 2 * hidden * kv + block_mlp) + vocab * hidden
    attention_flops = 12 * layers * hidden * seq_len if attention else 0
    return float(6 * matmul_params + attention_flops)


# --- what is planned: a model, a cluster, a layout -------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer: ``layers`` blocks of width ``hidden`` with ``heads`` query heads
    (``kv_heads`` key/value heads: grouped-query attention), vocabulary ``vocab``, trained on
    sequences of ``seq_len``; an MLP of width ``ffn`` (default 4h for GELU, Llama's 8h/3 rounded
    up to a multiple of 256 for SwiGLU), or ``moe_experts`` such MLPs of which each token uses
    ``top_k``, each with capacity factor ``capacity_factor``. ``tied``: the head shares the
    embedding's matrix (GPT-2, GPT-3, BLOOM) or has its own (the course's GPT, Llama). ``bias``:
    GPT-style Linear layers with biases and LayerNorms (weight and bias); without, Llama-style
    Linear layers and RMSNorms (a weight only). ``dropout``: dropout after attention and after the
    MLP (and on the attention probabilities of a naive kernel), whose masks are kept for backward."""

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
    kv_heads: int | None = None
    mlp: str = "gelu"
    tied: bool = False
    bias: bool = True
    dropout: bool = True

    def __post_init__(self):
        if self.mlp not in MLPS:
            raise ValueError(f"mlp must be one of {MLPS}, got {self.mlp!r}")
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"{self.kv_heads} key/value heads must divide the {self.heads} heads")

    @property
    def ffn_width(self) -> int:
        if self.ffn is not None:
            return self.ffn
        if self.mlp == "gelu":
            return 4 * self.hidden
        return 256 * math.ceil(8 * self.hidden / 3 / 256)

    @property
    def kv_width(self) -> int:
        """h_kv: the width of K (and of V), h·kv_heads/heads."""
        return self.hidden if self.kv_heads is None else self.hidden * self.kv_heads // self.heads

    def block_parameters(self) -> dict[str, int]:
        """One block's parameters: ``dense`` (attention, norms, router) and ``experts`` (0 without)."""
        h, f, kv, e = self.hidden, self.ffn_width, self.kv_width, self.moe_experts
        attention = 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if self.bias else 0)
        norms = 2 * (2 * h if self.bias else h)
        mlp = (2 if self.mlp == "gelu" else 3) * h * f + ((f if self.mlp == "gelu" else 2 * f) + h if self.bias else 0)
        if e:
            return {"dense": attention + norms + h * e, "experts": e * mlp}
        return {"dense": attention + norms + mlp, "experts": 0}

    def parameters(self) -> dict[str, int]:
        """Parameters by part: ``blocks`` (with the final norm), ``experts``, ``embedding``,
        ``head`` (0 when tied). Position embeddings are not counted (small, or none with rotary
        embeddings or ALiBi): as ``transformer_memory.parameters`` counts them."""
        block = self.block_parameters()
        final_norm = 2 * self.hidden if self.bias else self.hidden
        return {
            "blocks": self.layers * block["dense"] + final_norm,
            "experts": self.layers * block["experts"],
            "embedding": self.vocab * self.hidden,
            "head": 0 if self.tied else self.vocab * self.hidden,
        }

    def params(self) -> int:
        """All parameters (``parameters`` summed)."""
        return sum(self.parameters().values())

    def flops_per_token(self, attention: bool = True) -> float:
        """Model FLOPs of forward + backward per token (``flops_per_token``)."""
        return flops_per_token(
            layers=self.layers,
            hidden=self.hidden,
            seq_len=self.seq_len,
            vocab=self.vocab,
            ffn=self.ffn_width,
            moe_experts=self.moe_experts,
            top_k=self.top_k,
            attention=attention,
            heads=self.heads,
            kv_heads=self.kv_heads,
            mlp=self.mlp,
        )

    def matmuls(self) -> list[tuple[str, int]]:
        """A block's matmuls in the order the forward runs them, each with its weight's size (per
        token: with experts, the slots' share, k·C of an expert's MLP)."""
        h, f, kv = self.hidden, self.ffn_width, self.kv_width
        slots = self.top_k * self.capacity_factor if self.moe_experts else 1
        mlp = [("fc1", h * f), ("fc2", f * h)] if self.mlp == "gelu" else [("w1", h * f), ("w3", h * f), ("w2", f * h)]
        router = [("router", h * self.moe_experts)] if self.moe_experts else []
        return (
            [("q", h * h), ("k", h * kv), ("v", h * kv), ("proj", h * h)]
            + router
            + [(name, round(w * slots)) for name, w in mlp]
        )

    def layer_flops(self, recompute: str = "none", attention: str = "naive") -> dict[str, float]:
        """FLOPs one block executes per token in training, by part: ``matmuls`` (6 per weight,
        the experts' empty slots included), ``attention`` (naive: the whole square, 12·s·h;
        FlashAttention: 2·s·h forward and 5·s·h backward over the causal half, 7·s·h) and
        ``recompute`` (what the policy runs again forward, ``recomputed_matmuls``)."""
        weights = sum(w for _, w in self.matmuls())
        s, h = self.seq_len, self.hidden
        forward_attention = 4 * s * h if attention == "naive" else 2 * s * h
        attention_flops = 12 * s * h if attention == "naive" else 7 * s * h
        if recompute == "none":
            extra = 0.0
        elif recompute == "selective":
            extra = forward_attention
        elif recompute == "selective-op":
            extra = 2 * sum(w for _, w in recomputed_matmuls(self))
        elif recompute == "full":
            extra = 2 * weights + forward_attention
        else:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
        return {"matmuls": 6.0 * weights, "attention": float(attention_flops), "recompute": float(extra)}

    def hardware_flops_per_token(self, recompute: str = "none", attention: str = "naive") -> float:
        """FLOPs a GPU executes per token: every block's ``layer_flops`` and the head's 6·V·h.
        With naive attention and ``recompute="full"`` this is Megatron-LM's formula (SC21, eq. 3:
        4 passes of the blocks, 96·s·l·h²(1 + s/6h + V/16lh) per sequence)."""
        return self.layers * sum(self.layer_flops(recompute, attention).values()) + 6.0 * self.vocab * self.hidden


def recomputed_matmuls(m: Model) -> list[tuple[str, int]]:
    """torchtitan's per-op policy (``activation_checkpoint.selective_ac_option = "op"``, its
    ``_get_custom_policy``): in each block it saves the output of every op in its list (the matmuls,
    attention, the tensor-parallel reduce-scatters) except every second matmul, and recomputes the
    rest. The matmuls it runs again: the 2nd, 4th, ... of the block's forward."""
    return m.matmuls()[1::2]


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs of ``memory_bytes`` and ``peak_flops`` (dense 16-bit,
    the data sheet's); links as (α seconds, β bytes/s per direction): ``intra`` per GPU inside a
    node (NVLink), ``nic`` per network adapter, ``nics`` adapters per node; ``efficiency``, the
    fraction of peak that large matmuls reach."""

    name: str
    gpus_per_node: int
    nodes: int
    memory_bytes: float
    peak_flops: float
    intra: tuple[float, float]
    nic: tuple[float, float]
    nics: int = 8
    efficiency: float = 0.54

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def node_bandwidth(self) -> float:
        """Bytes/s a node sends to the network, all its NICs together (per direction)."""
        return self.nics * self.nic[1]


@dataclass(frozen=True)
class Layout:
    """Degrees of data (dp), tensor (tp), pipeline (pp), context (cp) and expert (ep, taken out
    of the dp x cp data ranks) parallelism; the ZeRO stage of the data-parallel ranks (0: DDP,
    3: FSDP); ``micro_batch``, sequences per data-parallel rank and forward; ``recompute``
    (``RECOMPUTE``); ``interleave``, the v model chunks per pipeline rank (1: plain 1F1B);
    ``sp``, sequence parallelism with tp (Korthikanti et al.); ``attention``, FlashAttention or a
    naive kernel that stores the s x s scores; ``accumulate``, how ZeRO-2/3 accumulate gradients
    over micro-batches (``sharded``: a reduce-scatter every micro-batch, FSDP2's and DeepSpeed's
    default; ``full``: an unsharded gradient buffer with the sync off until the last one);
    ``loss``, the logits sharded over tp (``parallel``: loss-parallel, torchtitan's default with
    TP), gathered on every tp rank (``replicated``) or computed ``LOSS_CHUNK`` tokens at a time
    (``chunked``)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    recompute: str = "none"
    interleave: int = 1
    sp: bool = True
    attention: str = "flash"
    accumulate: str = "sharded"
    loss: str = "parallel"

    # The command line's names of the fields, and the values a field may take.
    KEYS = {"micro": "micro_batch"}
    CHOICES = {"recompute": RECOMPUTE, "attention": ATTENTION, "accumulate": ACCUMULATE, "loss": LOSS}

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @classmethod
    def parse(cls, text: str) -> Layout:
        """A layout from ``"tp=8,pp=16,dp=128,zero=2,micro=1,recompute=none,interleave=2"`` (commas
        or spaces; keys left out take their defaults: degrees 1, ZeRO 0, no recomputation)."""
        names = {f.name for f in fields(cls)}
        values: dict[str, object] = {}
        for item in re.split(r"[,\s]+", text.strip()):
            if not item:
                continue
            key, sep, value = item.partition("=")
            name = cls.KEYS.get(key, key)
            if not sep or name not in names:
                known = sorted((names - set(cls.KEYS.values())) | set(cls.KEYS))
                raise ValueError(f"layout items are key=value with keys {', '.join(known)}; got {item!r}")
            if name in cls.CHOICES:
                if value not in cls.CHOICES[name]:
                    raise ValueError(f"{key} must be one of {', '.join(cls.CHOICES[name])}, got {value!r}")
                values[name] = value
            elif name == "sp":
                if value not in ("0", "1"):
                    raise ValueError(f"sp must be 0 or 1, got {value!r}")
                values[name] = value == "1"
            else:
                try:
                    values[name] = int(value)
                except ValueError:
                    raise ValueError(f"{key} must be an integer, got {value!r}") from None
        return cls(**values)

    def __str__(self) -> str:
        # The --layout syntax with spaces, defaults left out: "dp=16 tp=4 zero=1 micro=2" reads
        # faster than every key spelled out, and parses back.
        degrees = (("tp", self.tp), ("pp", self.pp), ("interleave", self.interleave), ("cp", self.cp), ("ep", self.ep))
        words = [f"dp={self.dp}"] + [f"{k}={v}" for k, v in degrees if v != 1]
        words += [f"zero={self.zero}", f"micro={self.micro_batch}"]
        for name, default in (("recompute", "none"), ("attention", "flash"), ("loss", "parallel")):
            if getattr(self, name) != default:
                words.append(f"{name}={getattr(self, name)}")
        if self.zero >= 2 and self.accumulate != "sharded":
            words.append(f"accumulate={self.accumulate}")
        if self.tp > 1 and not self.sp:
            words.append("sp=0")
        return " ".join(words)


# Where each preset's numbers come from:
# - A100 SXM: 312 TFLOP/s dense bf16 and NVLink 600 GB/s both directions (300 per direction), the
#   NVIDIA A100 data sheet, as chapter 06a quotes it. A memory data sheet's GB are GiB (HBM stacks
#   come in powers of two: 80 GB is 5 stacks of 16 GiB, 85.9 x 10^9 bytes; nvidia-smi shows
#   81,920 MiB on an A100 80GB), so the presets hold 40, 80 and 141 x 2^30 bytes; this module
#   prints 10^9-byte GB, as the rest of the course does.
#   Between nodes a DGX A100 has eight 200 Gb/s HDR InfiniBand adapters (NVIDIA DGX A100 user
#   guide; Selene, the cluster of Narayanan et al., SC21 section 5): 25 GB/s each.
# - H100 SXM: 989 TFLOP/s dense bf16 and NVLink 900 GB/s both directions (450 per direction), the
#   NVIDIA H100 data sheet (chapter 06a); a DGX H100 has eight 400 Gb/s NDR adapters (NVIDIA DGX
#   H100 user guide): 50 GB/s each. H200 SXM: the same GPU with 141 GB of HBM3e (NVIDIA H200 data
#   sheet: 141 GB, the same 989 TFLOP/s dense bf16 and 900 GB/s NVLink); a DGX H200 keeps the
#   eight 400 Gb/s adapters.
# - α: a few microseconds inside a node, about 10 between nodes: the order of NCCL's small-message
#   latency (an assumption of this model, not a data-sheet figure; chapter 06a fits it on a real
#   machine).
# - efficiency 0.54: chosen once so that Narayanan et al.'s SC21 Table 1 (ten GPT models on up to
#   3072 A100s) comes out within 25% on every row with this one value (tests/unit/test_planner.py);
#   the other presets take the same value. Runs it was not tuned on are in ``published_runs``.
GIB = 2**30
CLUSTERS = {
    "a100-40gb": Cluster("a100-40gb", 8, 1, 40 * GIB, 312e12, (5e-6, 300e9), (10e-6, 25e9), 8, 0.54),
    "a100-80gb": Cluster("a100-80gb", 8, 1, 80 * GIB, 312e12, (5e-6, 300e9), (10e-6, 25e9), 8, 0.54),
    "h100-80gb": Cluster("h100-80gb", 8, 1, 80 * GIB, 989e12, (5e-6, 450e9), (10e-6, 50e9), 8, 0.54),
    "h200": Cluster("h200", 8, 1, 141 * GIB, 989e12, (5e-6, 450e9), (10e-6, 50e9), 8, 0.54),
}

# GPT-3's shapes (Brown et al. 2020, Table 2.1), sequence 2048, GPT-2's vocabulary, the head tied to
# the embedding as in GPT-2 (Radford et al. 2019); the 13B model's width is 5120 (40 heads of 128:
# the parameter count of Table D.1 needs 5120; Table 2.1 prints 5140). Llama 3's (Llama Team,
# "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3; vocabulary 128,256 as released).
# BLOOM's (BigScience, arXiv:2211.05100; its training script bigscience-workshop/bigscience,
# train/tr11-176B-ml: vocabulary padded to 250,880, dropout 0.1 inherited from Megatron).
# MT-NLG's (Smith et al., arXiv:2201.11990: 105 x 20480, 128 heads; GPT-2's vocabulary padded as
# Megatron pads it for tp = 8, 51,200, as SC21 counts it).
_LLAMA = dict(mlp="swiglu", kv_heads=8, bias=False, dropout=False)
MODELS = {
    "gpt3-125m": Model("gpt3-125m", 12, 768, 12, 50257, 2048, tied=True),
    "gpt3-350m": Model("gpt3-350m", 24, 1024, 16, 50257, 2048, tied=True),
    "gpt3-760m": Model("gpt3-760m", 24, 1536, 16, 50257, 2048, tied=True),
    "gpt3-1.3b": Model("gpt3-1.3b", 24, 2048, 24, 50257, 2048, tied=True),
    "gpt3-2.7b": Model("gpt3-2.7b", 32, 2560, 32, 50257, 2048, tied=True),
    "gpt3-6.7b": Model("gpt3-6.7b", 32, 4096, 32, 50257, 2048, tied=True),
    "gpt3-13b": Model("gpt3-13b", 40, 5120, 40, 50257, 2048, tied=True),
    "gpt3-175b": Model("gpt3-175b", 96, 12288, 96, 50257, 2048, tied=True),
    "llama3-8b": Model("llama3-8b", 32, 4096, 32, 128256, 8192, ffn=14336, **_LLAMA),
    "llama3-70b": Model("llama3-70b", 80, 8192, 64, 128256, 8192, ffn=28672, **_LLAMA),
    "llama3-405b": Model("llama3-405b", 126, 16384, 128, 128256, 8192, ffn=53248, **_LLAMA),
    "bloom-176b": Model("bloom-176b", 70, 14336, 112, 250880, 2048, tied=True),
    "mt-nlg-530b": Model("mt-nlg-530b", 105, 20480, 128, 51200, 2048, tied=True),
    # A mixture of experts: the 1.3B shape with 64 experts per block, top-2 (GShard/Switch style).
    "moe-1.3b-64e": Model("moe-1.3b-64e", 24, 2048, 24, 50257, 2048, moe_experts=64, top_k=2),
}


def cluster(name: str, nodes: int = 1, **overrides) -> Cluster:
    """A preset with ``nodes`` nodes, any of its fields overridden (``memory_bytes``, ``nic``, ...)."""
    if name not in CLUSTERS:
        raise ValueError(f"cluster must be one of {sorted(CLUSTERS)}, got {name!r}")
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    return replace(CLUSTERS[name], nodes=nodes, **overrides)


def model(name: str, seq_len: int | None = None) -> Model:
    """A preset, optionally with another sequence length."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name] if seq_len is None else replace(MODELS[name], seq_len=seq_len)


# --- pipeline stages ---------------------------------------------------------------------------------


def stage_layers(layers: int, pp: int) -> list[int]:
    """Blocks per pipeline stage: as equal as the count allows, the extra blocks on the inner
    stages first (the first stage also holds the embedding, the last the head). 126 over 16 gives
    7, 8, ..., 8, 7 (Llama 3's balance: one block fewer on the first and last stages); 70 over 12
    gives 5, 6, ..., 6, 5 (BLOOM's: its script partitions with the tied embeddings counted)."""
    if pp < 1 or layers < pp:
        raise ValueError(f"pp={pp} needs at least one of the {layers} layers per stage")
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + ([0, pp - 1] if pp > 1 else [0])
    for stage in order[:extra]:
        counts[stage] += 1
    return counts


def in_flight(layout: Layout, stage: int, micro_batches: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at once, in units of the whole
    stage's: 1F1B holds min(p - stage, m); the interleaved schedule holds (v-1)·p + 2(p-1-stage) + 1
    chunks of 1/v of the stage each, at most all v·m (Megatron-LM's warm-up, chapter 07a's
    ``interleaved_orders``). Without a pipeline, one."""
    p, v, m = layout.pp, layout.interleave, micro_batches
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(p - stage, m))
    return min((v - 1) * p + 2 * (p - 1 - stage) + 1, v * m) / v


def bubble_share(p: int, m: int, v: int = 1) -> float:
    """Idle share of a pipelined step with equal stages: (p-1)/v micro-batch times of idle per
    stage against m of work, (p-1)/(v·m + p-1) of the step (v = 1: chapter 07a's (p-1)/(m+p-1))."""
    return 0.0 if p == 1 else (p - 1) / (v * m + p - 1)


# --- memory ------------------------------------------------------------------------------------------


def activation_terms(m: Model, layout: Layout) -> dict[str, tuple[float, str]]:
    """What one block keeps for backward, per token of the rank's s/cp: name -> (bytes, split),
    split "tp" for a tensor inside tensor parallelism's split (divided by t), "sp" for one that
    only sequence parallelism divides. 16-bit tensors, 1-byte dropout masks, fp32 statistics.
    With a naive kernel the scores are a·s per token (each local query against all s keys):
    softmax output 2·a·s, with dropout its mask a·s and output 2·a·s (Korthikanti et al.'s
    5·a·s²·b); FlashAttention keeps only its log-sum-exp, 4·a bytes. A dense block with a GELU
    MLP of 4h, dropout and no GQA keeps exactly Korthikanti's 34·s·b·h + 5·a·s²·b."""
    h, f, kv, a, s = m.hidden, m.ffn_width, m.kv_width, m.heads, m.seq_len
    drop = 1 if m.dropout else 0
    terms = {
        "norm inputs": (4.0 * h, "sp"),
        "attention input": (2.0 * h, "sp"),
        "q, k, v": (2.0 * h + 4.0 * kv, "tp"),
        "attention output": (2.0 * h, "tp"),
        "dropout masks": (2.0 * h * drop, "sp"),
    }
    if layout.attention == "naive":
        terms["scores"] = ((2.0 + 3.0 * drop) * a * s, "tp")
    else:
        terms["softmax statistics"] = (4.0 * a, "tp")
    inner = (4.0 if m.mlp == "gelu" else 8.0) * f
    if not m.moe_experts:
        terms["mlp input"] = (2.0 * h, "sp")
        terms["mlp inside"] = (inner, "tp")
        return terms
    # Experts (``transformer_memory``'s accounting): the router's fp32 probabilities and, per
    # choice, the expert's output the gate multiplies; per slot (k·C per token, filled or not) the
    # expert's input and what its MLP keeps.
    slots = m.top_k * m.capacity_factor
    terms["mlp input"] = (2.0 * h + 4.0 * m.moe_experts + 2.0 * h * m.top_k, "sp")
    terms["expert inputs"] = (2.0 * h * slots, "sp")
    terms["mlp inside"] = (inner * slots, "tp")
    return terms


def activation_bytes_per_layer(m: Model, layout: Layout, recompute: str | None = None) -> float:
    """Bytes one block keeps for backward on one GPU for one micro-batch (b sequences of s/cp
    positions), under the recomputation policy (the layout's unless given):

    - ``none``: every term of ``activation_terms``.
    - ``selective`` (Megatron-LM's ``--recompute-granularity selective``, Korthikanti et al.):
      attention's core (Q·Kᵀ, softmax, dropout, ·V) is recomputed, so its scores are not kept;
      with FlashAttention there are no scores to drop (only its statistics).
    - ``selective-op`` (torchtitan's per-op policy, ``recomputed_matmuls``): the block's input,
      attention's output and the outputs of the 1st, 3rd, ... matmuls.
    - ``full`` (every block checkpointed): the block's input.

    (With ``selective-op`` and ``full`` the block being recomputed needs all its activations once
    more during its backward: ``memory_by_stage`` adds one block's ``none``.)"""
    recompute = layout.recompute if recompute is None else recompute
    t = layout.tp
    per_rank = m.seq_len / layout.cp * layout.micro_batch

    def split(kind: str) -> float:
        return t if kind == "tp" or layout.sp else 1

    terms = activation_terms(m, layout)
    if recompute == "none":
        kept = terms
    elif recompute == "selective":
        kept = {k: v for k, v in terms.items() if k not in ("scores", "softmax statistics")}
    elif recompute == "selective-op":
        h, kv, f = m.hidden, m.kv_width, m.ffn_width
        outputs = {"q": h, "k": kv, "v": kv, "proj": h, "fc1": f, "fc2": h, "w1": f, "w3": f, "w2": h}
        slots = m.top_k * m.capacity_factor if m.moe_experts else 1
        kept = {"block input": (2.0 * h, "sp"), "attention output": terms["attention output"]}
        if "softmax statistics" in terms:
            kept["softmax statistics"] = terms["softmax statistics"]
        for name, _ in m.matmuls()[0::2]:
            if name == "router":
                continue
            # Row-parallel outputs (proj, fc2, w2) are kept after their reduce-scatter (torchtitan
            # saves it): split as sequence parallelism splits; the others inside tp's split.
            kind = "sp" if name in ("proj", "fc2", "w2") else "tp"
            many = slots if name in ("fc1", "fc2", "w1", "w3", "w2") else 1
            kept[f"{name} output"] = (2.0 * outputs[name] * many, kind)
    elif recompute == "full":
        kept = {"block input": (2.0 * m.hidden, "sp")}
    else:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    return per_rank * sum(nbytes / split(kind) for nbytes, kind in kept.values())


def _sharding(layout: Layout) -> tuple[int, int]:
    """Ranks that hold the same dense parameters (dp x cp) and the same experts (dp x cp / ep)."""
    n = layout.dp * layout.cp
    return n, n // layout.ep


def _stage_counts(m: Model, layout: Layout, stage: int) -> tuple[float, float]:
    """(dense, experts): parameters one GPU of a pipeline stage holds before ZeRO shards them."""
    counts = stage_layers(m.layers, layout.pp)
    block, p = m.block_parameters(), m.parameters()
    first, last = stage == 0, stage == layout.pp - 1
    dense = counts[stage] * block["dense"] + ((p["blocks"] - m.layers * block["dense"]) if last else 0)
    if layout.pp == 1:
        dense += p["embedding"] + p["head"]
    else:
        dense += m.vocab * m.hidden * (int(first) + int(last))
    return dense / layout.tp, counts[stage] * block["experts"] / (layout.ep * layout.tp)


def stage_parameters(m: Model, layout: Layout, stage: int = 0) -> float:
    """Parameters one GPU of a pipeline stage holds before ZeRO shards anything (ZeRO-3: after,
    as FSDP shards them): the stage's blocks split by tp (experts by ep too), the embedding on the
    first stage and the head (the embedding's copy when tied, as Megatron-LM keeps one on each end)
    and final norm on the last, split by tp (vocabulary-parallel). With pp = 1 and an untied head,
    ``transformer_memory.parameters_per_rank``'s count for its layouts with sequence parallelism."""
    dense, experts = _stage_counts(m, layout, stage)
    if layout.zero == 3:
        n_dense, n_experts = _sharding(layout)
        return dense / n_dense + experts / n_experts
    return dense + experts


def _states(m: Model, layout: Layout, stage: int) -> dict[str, float]:
    """Weights, gradients and Adam's states of a stage's GPU (mixed precision: 2 + 2 + 12 bytes
    per parameter, ZeRO's accounting), each divided over the dp x cp ranks that share it as the
    ZeRO stage says: 1 the optimizer's, 2 also the gradients' (unless they accumulate in a full
    buffer), 3 also the weights'."""
    dense, experts = _stage_counts(m, layout, stage)
    n_dense, n_experts = _sharding(layout)
    whole, sharded = dense + experts, dense / n_dense + experts / n_experts
    precision = memory.precision("mixed")
    z = layout.zero
    return {
        "weights": precision.weights * (sharded if z == 3 else whole),
        "gradients": precision.gradients * (sharded if z >= 2 and layout.accumulate == "sharded" else whole),
        "optimizer": precision.optimizer * (sharded if z >= 1 else whole),
    }


def memory_by_stage(m: Model, layout: Layout, micro_batches: int = 1) -> list[dict[str, float]]:
    """Bytes on one GPU of each pipeline stage, by part: ``weights``, ``gradients``,
    ``optimizer`` (``_states``); ``activations`` (``activation_bytes_per_layer`` x the stage's
    blocks x ``in_flight``; with ``selective-op`` or ``full``, plus one block's whole activations
    while it is recomputed); ``logits`` (last stage: the fp32 logits and their gradient, 8 bytes per
    token and vocabulary entry, of the tokens the loss holds at once, divided by tp when
    loss-parallel); ``buffers`` (the cp ring's K/V blocks in flight, 16·(s/cp)·b·h_kv/t; the
    experts' dispatch buffer; with ZeRO-3 two gathered blocks in 16 bits)."""
    counts = stage_layers(m.layers, layout.pp)
    layer = activation_bytes_per_layer(m, layout)
    whole_layer = activation_bytes_per_layer(m, layout, "none")
    t, per_rank = layout.tp, m.seq_len / layout.cp * layout.micro_batch
    ring = 16 * per_rank * m.kv_width / t if layout.cp > 1 else 0.0
    dispatch = 0.0
    if m.moe_experts and layout.ep > 1:
        dispatch = 2 * m.top_k * m.capacity_factor * per_rank * m.hidden / (t if layout.sp else 1)
    buffers = max(ring, dispatch)
    if layout.zero == 3:
        block = m.block_parameters()
        buffers += 2 * 2 * (block["dense"] + block["experts"] / layout.ep) / t
    if layout.loss == "chunked":
        logits = 8.0 * min(per_rank, LOSS_CHUNK) * m.vocab
    else:
        logits = 8.0 * per_rank * m.vocab / (t if layout.loss == "parallel" else 1)
    out = []
    for stage, blocks in enumerate(counts):
        activations = layer * blocks * in_flight(layout, stage, micro_batches)
        if layout.recompute in ("selective-op", "full"):
            activations += whole_layer
        parts = _states(m, layout, stage)
        parts.update(activations=activations, logits=logits if stage == layout.pp - 1 else 0.0, buffers=buffers)
        out.append(parts)
    return out


def memory_per_gpu(m: Model, layout: Layout, micro_batches: int = 1) -> dict[str, float]:
    """Bytes on the busiest GPU, by part (``memory_by_stage``'s stage with the largest total)."""
    return max(memory_by_stage(m, layout, micro_batches), key=lambda parts: sum(parts.values()))


# --- communication ---------------------------------------------------------------------------------

AXES = ("tp", "cp", "ep", "dp", "pp")


def group(c: Cluster, layout: Layout, axis: str) -> tuple[int, int]:
    """(n, k): the size of one group of ``axis`` and how many of its ranks share a node. The mesh
    is tp (innermost: neighbouring GPUs), cp, dp, pp; ep groups take neighbouring data ranks (next
    to tp). A group's ranks are ``stride`` apart: k = gpus_per_node / stride of them in a node (all
    n if the group fits in one), at least 1."""
    sizes = {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp * layout.cp, "pp": layout.pp}
    strides = {"tp": 1, "cp": layout.tp, "ep": layout.tp, "dp": layout.tp, "pp": layout.tp * layout.cp * layout.dp}
    n, stride = sizes[axis], strides[axis]
    return n, max(1, min(n, c.gpus_per_node // stride))


def links(c: Cluster, layout: Layout) -> dict[str, str]:
    """``"intra"`` for each axis whose groups fit in a node, ``"inter"`` for those that span nodes."""
    out = {}
    for axis in AXES:
        n, k = group(c, layout, axis)
        out[axis] = "intra" if k == n else "inter"
    return out


def network_share(c: Cluster, k: int) -> float:
    """Bytes/s across a node boundary for one group with k ranks in the node: the node's NICs are
    shared by the gpus_per_node / k groups of the same axis that run at once (every rank runs its
    axis's collective at the same time), so each group gets k / gpus_per_node of them."""
    return c.node_bandwidth * k / c.gpus_per_node


def ring_s(c: Cluster, n: int, k: int, nbytes: float, steps: int) -> float:
    """A ring collective of ``steps`` steps whose every ring edge carries ``nbytes`` in all: inside
    a node at NVLink's β; across nodes the edges that cross a node boundary are the slowest, at
    ``network_share``, each step paying the network's α."""
    if n == 1:
        return 0.0
    if k == n:
        return steps * c.intra[0] + nbytes / c.intra[1]
    return steps * c.nic[0] + max(nbytes / network_share(c, k), nbytes / c.intra[1])


def all_reduce_s(c: Cluster, n: int, k: int, nbytes: float) -> float:
    """Ring all-reduce of ``nbytes``: 2(n-1) steps, 2(n-1)/n·S over every edge (chapter 01)."""
    return ring_s(c, n, k, 2 * (n - 1) / n * nbytes, 2 * (n - 1)) if n > 1 else 0.0


def all_gather_s(c: Cluster, n: int, k: int, nbytes: float) -> float:
    """Ring all-gather (or reduce-scatter) of ``nbytes`` in all: n-1 steps, (n-1)/n·S per edge."""
    return ring_s(c, n, k, (n - 1) / n * nbytes, n - 1) if n > 1 else 0.0


def all_to_all_s(c: Cluster, n: int, k: int, nbytes: float) -> float:
    """All-to-all of a send buffer of ``nbytes`` per rank: (n-k)/n of it leaves the node, every
    rank of the node sending at once (each at 1/gpus_per_node of the NICs); the rest goes over
    NVLink; n-1 messages' α."""
    if n == 1:
        return 0.0
    if k == n:
        return (n - 1) * c.intra[0] + (n - 1) / n * nbytes / c.intra[1]
    across = (n - k) / n * nbytes / (c.node_bandwidth / c.gpus_per_node)
    return (n - 1) * c.nic[0] + max(across, (k - 1) / n * nbytes / c.intra[1])


# --- the plan ----------------------------------------------------------------------------------------


@dataclass
class Plan:
    """A layout's prediction; times in seconds per optimizer step, bytes per GPU (the busiest,
    pipeline stage ``stage``)."""

    model: Model
    cluster: Cluster
    layout: Layout
    global_batch: int
    micro_batches: int
    memory: dict[str, float]
    stage: int
    compute_s: float
    comm_s: dict[str, float]
    hidden_s: float
    bubble_s: float
    links: dict[str, str]
    problems: list[str] = field(default_factory=list)
    usable: float = 0.9

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def runs(self) -> bool:
        """Whether the layout can run at all (it may still be rejected for memory)."""
        return self.compute_s != math.inf

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
        """Model FLOPs per second over the dense 16-bit peak of every GPU the layout uses (PaLM's
        MFU), a fraction."""
        return self.tokens_per_s * self.model.flops_per_token() / (self.layout.gpus * self.cluster.peak_flops)

    @property
    def hardware_flops_per_gpu(self) -> float:
        """FLOP/s one GPU executes, recomputation and empty expert slots included (what
        Megatron-LM's papers report as "achieved teraFLOP/s per GPU")."""
        per_token = self.model.hardware_flops_per_token(self.layout.recompute, self.layout.attention)
        return self.tokens_per_s * per_token / self.layout.gpus

    @property
    def fixes(self) -> list[str]:
        """When memory is what fails: the single changes that would make the layout fit
        (``memory_fixes``)."""
        if not self.runs or self.memory_bytes <= self.usable * self.cluster.memory_bytes:
            return []
        return memory_fixes(self.model, self.cluster, self.layout, self.global_batch, self.usable)

    @property
    def reasons(self) -> list[str]:
        """Why the layout is rejected, then what would make it fit."""
        found = self.fixes
        return self.problems + ([f"fits with {' or '.join(found)}"] if found else [])

    def to_dict(self) -> dict:
        """The plan as ``--json`` prints it."""
        runs = self.runs
        return {
            "model": self.model.name,
            "cluster": f"{self.cluster.nodes} x {self.cluster.gpus_per_node} {self.cluster.name}",
            "layout": str(self.layout),
            "gpus": self.layout.gpus,
            "global_batch": self.global_batch,
            "micro_batches": self.micro_batches,
            "fits": self.fits,
            "memory_gb": {"total": self.memory_bytes / GB, "stage": self.stage}
            | {k: v / GB for k, v in self.memory.items()},
            "usable_gb": self.usable * self.cluster.memory_bytes / GB,
            "step_s": self.step_s if runs else None,
            "compute_s": self.compute_s if runs else None,
            "exposed_comm_s": self.exposed_comm_s if runs else None,
            "bubble_s": self.bubble_s if runs else None,
            "tokens_per_s": self.tokens_per_s if runs else None,
            "mfu": self.mfu if runs else None,
            "reasons": self.reasons,
        }

    def summary(self) -> str:
        """The plan as aligned lines (GB = 10^9 bytes)."""
        head = f"{self.model.name} on {self.layout.gpus} GPUs ({self.cluster.name}): {self.layout}"
        if not self.runs:
            return f"{head}\n  cannot run: " + "; ".join(self.problems)
        mem = ", ".join(f"{k} {v / GB:.1f}" for k, v in self.memory.items() if v)
        comm = ", ".join(f"{k} {1e3 * v:.0f} ms ({self.links[k]})" for k, v in self.comm_s.items() if v)
        where = f" (stage {self.stage} of {self.layout.pp})" if self.layout.pp > 1 else ""
        lines = [
            f"{head}, {self.micro_batches} micro-batches of {self.layout.micro_batch}",
            f"  memory per GPU  {self.memory_bytes / GB:6.1f} GB of {self.cluster.memory_bytes / GB:.0f}{where}: {mem}",
            f"  compute         {1e3 * self.compute_s:8.0f} ms",
            f"  communication   {1e3 * sum(self.comm_s.values()):8.0f} ms, {1e3 * self.hidden_s:.0f} ms of it hidden"
            + (f" ({comm})" if comm else ""),
            f"  bubble          {1e3 * self.bubble_s:8.0f} ms",
            f"  step            {1e3 * self.step_s:8.0f} ms: {self.tokens_per_s:,.0f} tokens/s, MFU {self.mfu:.1%}",
        ]
        lines.append("  feasible" if self.fits else "  rejected: " + "; ".join(self.reasons))
        return "\n".join(lines)


def check_layout(m: Model, c: Cluster, layout: Layout, global_batch: int) -> list[str]:
    """Why a layout cannot run at all, each reason a short phrase (``plan`` adds the layouts that
    run but should not: out of memory, tensor parallelism across nodes)."""
    problems = []
    degrees = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.micro_batch, layout.interleave)
    if min(degrees) < 1:
        return ["every degree, the micro-batch and interleave must be >= 1"]
    for name, choices in Layout.CHOICES.items():
        if getattr(layout, name) not in choices:
            problems.append(f"{name} must be one of {', '.join(choices)}")
    if layout.zero not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage {layout.zero} is not 0..3")
    if layout.gpus > c.gpus:
        problems.append(f"needs {layout.gpus} GPUs, the cluster has {c.gpus}")
    if m.heads % layout.tp:
        problems.append(f"tp={layout.tp} does not divide the {m.heads} heads")
    elif m.kv_heads is not None and m.kv_heads % layout.tp:
        problems.append(f"tp={layout.tp} does not divide the {m.kv_heads} key/value heads")
    if layout.pp > m.layers:
        problems.append(f"pp={layout.pp} leaves a stage without any of the {m.layers} layers")
    elif layout.interleave > 1 and (layout.pp == 1 or min(stage_layers(m.layers, layout.pp)) < layout.interleave):
        problems.append(f"interleave={layout.interleave} needs pp > 1 and at least that many layers per stage")
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
    may use ``usable`` of its memory (the rest: CUDA context, a framework's buffers,
    fragmentation)."""
    problems = check_layout(m, c, layout, global_batch)
    if problems:
        no_time = dict.fromkeys(AXES, 0.0)
        return Plan(
            m, c, layout, global_batch, 0, {}, 0, math.inf, no_time, 0.0, 0.0, links(c, layout), problems, usable
        )
    t, p, cp, ep, b, v = layout.tp, layout.pp, layout.cp, layout.ep, layout.micro_batch, layout.interleave
    micro_batches = global_batch // (layout.dp * b)
    by_stage = memory_by_stage(m, layout, micro_batches)
    stage = max(range(p), key=lambda i: sum(by_stage[i].values()))
    mem = by_stage[stage]
    if t > c.gpus_per_node:
        problems.append(f"tp={t} spans nodes: its collectives in every layer would cross the network")
    need = sum(mem.values())
    if need > usable * c.memory_bytes:
        largest = max(mem, key=mem.get)
        problems.append(
            f"needs {need / GB:.0f} GB per GPU, {usable * c.memory_bytes / GB:.0f} GB usable "
            f"({usable:.0%} of {c.memory_bytes / GB:.0f}); largest part: {largest}, {mem[largest] / GB:.0f} GB"
        )

    rate = c.peak_flops * c.efficiency
    counts = stage_layers(m.layers, p)
    # Per micro-batch, per GPU: the stage's blocks (and the head on the last), tokens split t x cp.
    tokens = m.seq_len * b / (t * cp)
    layer_flops = sum(m.layer_flops(layout.recompute, layout.attention).values())
    head_flops = 6.0 * m.vocab * m.hidden
    compute_mb = [(n * layer_flops + (head_flops if i == p - 1 else 0.0)) * tokens / rate for i, n in enumerate(counts)]

    groups = {axis: group(c, layout, axis) for axis in AXES}
    # A micro-batch's activation on one rank, 16 bits: s/cp positions x b x h.
    act = 2 * m.seq_len / cp * b * m.hidden
    passes = {"none": 2, "selective": 2, "selective-op": 2.5, "full": 3}[layout.recompute]
    # tp: per block two all-gathers and two reduce-scatters (sequence parallelism) or two
    # all-reduces per pass, the same bytes (Korthikanti et al., section 4.2.2); torchtitan's
    # per-op policy gathers again for the half of the matmuls it recomputes.
    tp_layer = 2 * passes * all_reduce_s(c, *groups["tp"], act)
    ep_layer = 0.0
    if ep > 1:
        slots = m.top_k * m.capacity_factor * act / (t if layout.sp else 1)
        ep_layer = 2 * passes * all_to_all_s(c, *groups["ep"], slots)
    exposed_mb = [n * (tp_layer + ep_layer) for n in counts]
    slowest = max(range(p), key=lambda i: compute_mb[i] + exposed_mb[i])
    per_mb = compute_mb[slowest] + exposed_mb[slowest]
    n_layers = counts[slowest]

    comm = dict.fromkeys(AXES, 0.0)
    comm["tp"] = micro_batches * n_layers * tp_layer
    comm["ep"] = micro_batches * n_layers * ep_layer
    # cp ring: cp-1 steps passing K and V forward (again when recomputing), K, V, dK, dV backward.
    if cp > 1:
        n, k = groups["cp"]
        kv = 2 * act / m.hidden * m.kv_width / t
        forwards = 2 if layout.recompute == "full" else 1
        ring = forwards * ring_s(c, n, k, (cp - 1) * kv, cp - 1) + ring_s(c, n, k, (cp - 1) * 2 * kv, cp - 1)
        comm["cp"] = micro_batches * n_layers * ring
    # dp: the stage's gradients in 16 bits over the dp x cp ranks.
    n_dp, k_dp = groups["dp"]
    grads = 2 * stage_parameters(m, replace(layout, zero=0), slowest)
    gathers = 0.0
    reduce_each = 0.0
    if layout.zero == 3:
        # FSDP: all-gather the weights forward and again backward in every micro-batch.
        gathers = micro_batches * 2 * all_gather_s(c, n_dp, k_dp, grads)
    if layout.zero >= 2 and layout.accumulate == "sharded":
        # A reduce-scatter every micro-batch (ZeRO-2 then gathers the updated weights once).
        reduce_each = all_gather_s(c, n_dp, k_dp, grads)
        reduce = micro_batches * reduce_each + (all_gather_s(c, n_dp, k_dp, grads) if layout.zero == 2 else 0.0)
    elif layout.zero == 3:
        reduce = all_gather_s(c, n_dp, k_dp, grads)
    else:
        # DDP, ZeRO-1, ZeRO-2 with a full buffer: an all-reduce, or a reduce-scatter and an
        # all-gather, the same bytes, once per step.
        reduce = all_reduce_s(c, n_dp, k_dp, grads)
    comm["dp"] = gathers + reduce
    # pp: each micro-batch's activation forward and its gradient backward at every chunk boundary.
    if p > 1:
        n, k = groups["pp"]
        send = act / (t if layout.sp else 1)
        beta = c.intra[1] if k == n else c.node_bandwidth / c.gpus_per_node
        alpha = c.intra[0] if k == n else c.nic[0]
        comm["pp"] = 2 * (micro_batches * v + p - 1) * message_time(send, beta, alpha)

    # What hides: the gradient reduction behind backward (each micro-batch's reduce-scatter
    # behind its own backward, else the one reduction behind the last micro-batch's); FSDP's
    # gathers and the cp ring behind the compute they prefetch for.
    compute_s = micro_batches * compute_mb[slowest]
    backward = compute_mb[slowest] * (2 / 3 if layout.recompute == "none" else 3 / 4)
    if reduce_each:
        # ZeRO-2's gather of the updated weights follows the optimizer step: it does not hide.
        hidden = micro_batches * min(reduce_each, backward)
    else:
        hidden = min(reduce, backward)
    hidden += min(gathers + comm["cp"], compute_s)
    hidden = min(hidden, compute_s)
    bubble_s = (p - 1) / v * per_mb if p > 1 else 0.0
    return Plan(
        m,
        c,
        layout,
        global_batch,
        micro_batches,
        mem,
        stage,
        compute_s,
        comm,
        hidden,
        bubble_s,
        links(c, layout),
        problems,
        usable,
    )


def memory_fixes(m: Model, c: Cluster, layout: Layout, global_batch: int, usable: float = 0.9) -> list[str]:
    """The single changes, nearest first, that bring the busiest GPU within ``usable`` of its
    memory, each with the memory it would need: more recomputation, a higher ZeRO stage, a
    sharded gradient accumulation, half the micro-batch (twice the micro-batches), twice the
    tensor-parallel degree inside a node or twice the pipeline stages (dp halved), more context
    parallelism. At most three."""
    candidates = []
    for policy in RECOMPUTE[RECOMPUTE.index(layout.recompute) + 1 :]:
        candidates.append(replace(layout, recompute=policy))
    if layout.zero >= 2 and layout.accumulate == "full":
        candidates.append(replace(layout, accumulate="sharded"))
    candidates += [replace(layout, zero=z) for z in range(layout.zero + 1, 4)]
    if layout.micro_batch > 1:
        candidates.append(replace(layout, micro_batch=layout.micro_batch // 2))
    if layout.dp % 2 == 0:
        if 2 * layout.tp <= c.gpus_per_node:
            candidates.append(replace(layout, tp=2 * layout.tp, dp=layout.dp // 2))
        candidates.append(replace(layout, pp=2 * layout.pp, dp=layout.dp // 2))
        candidates.append(replace(layout, cp=2 * layout.cp, dp=layout.dp // 2))
    found = []
    for other in candidates:
        if check_layout(m, c, other, global_batch):
            continue
        need = sum(memory_per_gpu(m, other, global_batch // (other.dp * other.micro_batch)).values())
        if need <= usable * c.memory_bytes:
            changed = " ".join(w for w in str(other).split() if w not in str(layout).split())
            found.append(f"{changed or str(other)} ({need / GB:.0f} GB)")
    return found[:3]


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
    recomputes=("none", "selective-op", "full"),
    interleaves=(1,),
    usable: float = 0.9,
) -> tuple[list[Plan], list[Plan]]:
    """Every layout that uses all of the cluster's GPUs: (feasible plans, fastest first; the
    others, each with its ``problems``). Degrees are powers of two unless given."""
    # Also degrees that fail (tp across nodes, more stages than layers): their reasons teach.
    tps = tps or _powers_of_two(min(2 * c.gpus_per_node, c.gpus))
    pps = pps or _powers_of_two(c.gpus)
    eps = eps or (_powers_of_two(min(m.moe_experts, c.gpus)) if m.moe_experts else [1])
    feasible, rejected = [], []
    for tp, pp, cp, ep, zero, b, recompute, v in itertools.product(
        tps, pps, cps, eps, zeros, micro_batches, recomputes, interleaves
    ):
        dp, rest = divmod(c.gpus, tp * pp * cp)
        if rest or dp < 1 or (v > 1 and pp == 1):
            continue
        layout = Layout(dp, tp, pp, cp, ep, zero, b, recompute, v)
        p = plan(m, c, layout, global_batch, usable)
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
    lines = [f"{'layout':44} {'GB/GPU':>7} {'step':>9} {'tokens/s':>10} {'MFU':>6}  exposed comm, bubble"]
    for p in plans:
        lines.append(
            f"{str(p.layout):44} {p.memory_bytes / GB:7.1f} {1e3 * p.step_s:7.0f} ms {p.tokens_per_s:10,.0f}"
            f" {p.mfu:6.1%}  {1e3 * p.exposed_comm_s:.0f} ms, {1e3 * p.bubble_s:.0f} ms"
        )
    return lines


# --- when FP8 pays (chapter 17a) ---------------------------------------------------------------------
#
# torchao's roofline of a linear layer's training step in FP8 (torchao/testing/training/
# roofline_utils.py, ``get_gemm_time_sympy`` and ``get_float8_mem_sympy``, tensorwise recipe), in
# plain numbers: the three matmuls of forward and backward, each bounded by compute, memory or a
# kernel launch, and the casts to FP8, memory-bound kernels that read bfloat16 and write eight bits.
# Peaks: the data sheets (dense, no sparsity): H100 SXM 989 TFLOP/s bf16, 1979 fp8, 3.35 TB/s HBM3;
# H200 the same chip with 4.8 TB/s HBM3e. The fractions of peak are torchao's ("based on experimental
# observation" on H100s: 78 % for matmuls, 92 % for pointwise kernels), and so is the launch cost.

KERNEL_LAUNCH_S = 2e-6


@dataclass(frozen=True)
class Roofline:
    """A GPU's peaks for ``float8_linear_times``: dense bf16 and fp8 FLOP/s, memory bytes/s, and the
    fractions of them that matmuls and pointwise kernels reach."""

    name: str
    bf16_flops: float
    fp8_flops: float
    memory_bandwidth: float
    matmul_efficiency: float = 0.78
    memory_efficiency: float = 0.92


ROOFLINES = {"h100": Roofline("h100", 989e12, 1979e12, 3.35e12), "h200": Roofline("h200", 989e12, 1979e12, 4.8e12)}


def _matmul_s(gpu: Roofline, m: int, k: int, n: int, fp8: bool) -> float:
    """One (m x k) @ (k x n): compute, or the bytes read and written (fp8 operands, a bf16 result), or a launch."""
    compute = 2 * m * k * n / ((gpu.fp8_flops if fp8 else gpu.bf16_flops) * gpu.matmul_efficiency)
    moved = (m * k + k * n) * (1 if fp8 else 2) + m * n * 2
    return max(compute, moved / (gpu.memory_bandwidth * gpu.memory_efficiency), KERNEL_LAUNCH_S)


def _kernels_s(gpu: Roofline, byte_counts: list[float]) -> float:
    return sum(max(b / (gpu.memory_bandwidth * gpu.memory_efficiency), KERNEL_LAUNCH_S) for b in byte_counts)


def float8_linear_times(m: int, k: int, n: int, gpu: Roofline, fused_casts: bool = False) -> dict[str, float]:
    """Seconds for a linear of an (m x k) input and a (k x n) weight, forward and backward: ``bf16``
    (its three matmuls in bfloat16), ``fp8_matmuls`` (the same in FP8) and ``casts`` (tensorwise
    dynamic scaling: per tensor an amax kernel, a reduction of negligible bytes, and a cast that
    writes the eight-bit tensor in both layouts its matmuls read; the weight's cast runs once in
    forward and once in backward). ``fused_casts``: the amax of the input and of the output's
    gradient read as the kernel before them writes them (what torch.compile can fuse); the weight's
    never is. torchao's model, term by term."""
    elements = {"input": m * k, "weight": k * n, "grad_output": m * n}
    casts = []
    for role, numel in elements.items():
        amax = 0 if fused_casts and role != "weight" else 2 * numel
        if role == "weight":
            casts += [amax, 0, 3 * numel, 3 * numel]
        else:
            casts += [amax, 0, 4 * numel]
    return {
        "bf16": _matmul_s(gpu, m, k, n, False) + _matmul_s(gpu, m, n, k, False) + _matmul_s(gpu, k, m, n, False),
        "fp8_matmuls": _matmul_s(gpu, m, k, n, True) + _matmul_s(gpu, m, n, k, True) + _matmul_s(gpu, k, m, n, True),
        "casts": _kernels_s(gpu, casts),
    }


def float8_speedup(m: int, k: int, n: int, gpu: Roofline, fused_casts: bool = False) -> float:
    """bf16 time over FP8 time (matmuls and casts) of one linear's training step: above 1, FP8 pays."""
    t = float8_linear_times(m, k, n, gpu, fused_casts)
    return t["bf16"] / (t["fp8_matmuls"] + t["casts"])


def describe_float8_speedups(sides: list[int], curves: dict[str, list[float]]) -> str:
    """A text alternative for curves of ``float8_speedup`` against the side N of square matmuls:
    for each curve, where FP8 starts to pay (speedup above 1) and its speedup at the largest N."""
    parts = []
    for label, speedups in curves.items():
        paying = [side for side, speedup in zip(sides, speedups) if speedup > 1]
        where = f"above 1 from N = {paying[0]}" if paying else "below 1 throughout"
        parts.append(f"{label}: {speedups[0]:.2f} at N = {sides[0]}, {where}, {speedups[-1]:.2f} at N = {sides[-1]}")
    return (
        f"FP8's speedup over bfloat16 of one linear's training step, against N from {sides[0]} to {sides[-1]} "
        "(log scale), with a line at 1. " + "; ".join(parts) + "."
    )


def linear_shapes(m: Model) -> list[tuple[str, int, int]]:
    """A block's linears as (name, k inputs, n outputs), in ``Model.matmuls``'s order (dense MLPs)."""
    h, f, kv = m.hidden, m.ffn_width, m.kv_width
    mlp = [("fc1", h, f), ("fc2", f, h)] if m.mlp == "gelu" else [("w1", h, f), ("w3", h, f), ("w2", f, h)]
    return [("q", h, h), ("k", h, kv), ("v", h, kv), ("proj", h, h)] + mlp


def float8_linears(m: Model, tokens: int, gpu: Roofline, fused_casts: bool = False) -> list[tuple[str, float]]:
    """Each of a block's linears with ``tokens`` rows (micro-batch x sequence on one GPU) and its
    FP8 speedup (``float8_speedup``)."""
    return [(name, float8_speedup(tokens, k, n, gpu, fused_casts)) for name, k, n in linear_shapes(m)]


# --- command line ------------------------------------------------------------------------------------

SHAPE_FLAGS = {
    "layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "ffn": "ffn",
    "vocab": "vocab",
    "seq": "seq_len",
    "mlp": "mlp",
}


def model_from_args(args) -> Model:
    """The model of the command line: a preset (``--model``) with any shape flag overriding it, or
    a model made of the flags alone (then --layers, --hidden, --heads, --vocab and --seq are
    needed)."""
    given = {field_: getattr(args, flag) for flag, field_ in SHAPE_FLAGS.items() if getattr(args, flag) is not None}
    if args.head is not None:
        given["tied"] = args.head == "tied"
    if args.model is not None:
        return replace(model(args.model), **given)
    missing = [f"--{f}" for f in ("layers", "hidden", "heads", "vocab", "seq") if getattr(args, f) is None]
    if missing:
        raise ValueError(f"give --model PRESET or the model's shape: {', '.join(missing)} missing")
    # A model of flags is GPT-style with GELU (biases, LayerNorm, dropout), Llama-style with SwiGLU.
    gpt_style = given.get("mlp", "gelu") == "gelu"
    return Model("custom", **given, bias=gpt_style, dropout=gpt_style)


def cluster_from_args(args, gpus: int | None) -> Cluster:
    """The cluster of the command line: a preset with ``--nodes`` (default: 8 to search; enough
    for the layout to evaluate one) and any of its memory or links overridden."""
    base = cluster(args.cluster)
    nodes = args.nodes if args.nodes is not None else (math.ceil(gpus / base.gpus_per_node) if gpus else 8)
    overrides = {}
    if args.gpu_memory_gb is not None:
        overrides["memory_bytes"] = args.gpu_memory_gb * GB
    if args.nvlink_gbs is not None:
        overrides["intra"] = (base.intra[0], args.nvlink_gbs * GB)
    if args.nic_gbps is not None:
        overrides["nic"] = (base.nic[0], args.nic_gbps * 1e9 / 8)
    if args.nics is not None:
        overrides["nics"] = args.nics
    if args.efficiency is not None:
        overrides["efficiency"] = args.efficiency
    return cluster(args.cluster, nodes, **overrides)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parallel_course.planner",
        description="Evaluate a layout (--layout) or rank every layout of a model on a cluster by predicted "
        "step time, saying why the others fail.",
        epilog=f"models: {', '.join(MODELS)}; clusters: {', '.join(CLUSTERS)}. Layout keys: dp, tp, pp, cp, "
        "ep, zero, micro (sequences per micro-batch), recompute (none|selective|selective-op|full), "
        "interleave (chunks per pipeline rank), sp (0|1), attention (flash|naive), "
        "accumulate (sharded|full), loss (parallel|replicated|chunked).",
    )
    parser.add_argument("--layout", help='a layout to evaluate, e.g. "tp=8,pp=16,dp=128,zero=2,micro=1,interleave=2"')
    parser.add_argument("--model", default=None, help="a model preset (default gpt3-6.7b unless the shape is given)")
    for flag in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab"):
        parser.add_argument(f"--{flag}", type=int, default=None, help=f"the model's {flag.replace('-', ' ')}")
    parser.add_argument("--seq", "--seq-len", dest="seq", type=int, default=None, help="sequence length")
    parser.add_argument(
        "--mlp",
        choices=MLPS,
        default=None,
        help="the MLP: gelu (with biases, LayerNorm and dropout, as GPT) or swiglu (none of them, as Llama)",
    )
    parser.add_argument("--head", choices=("tied", "untied"), default=None, help="the head shares the embedding or not")
    parser.add_argument("--cluster", default="a100-80gb", help="a cluster preset (see below)")
    parser.add_argument("--nodes", type=int, default=None, help="nodes of the cluster (default: 8 to search)")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="memory per GPU, GB")
    parser.add_argument("--nvlink-gbs", type=float, default=None, help="NVLink per GPU and direction, GB/s")
    parser.add_argument("--nics", type=int, default=None, help="network adapters per node")
    parser.add_argument("--nic-gbps", type=float, default=None, help="one adapter's rate, Gb/s")
    parser.add_argument("--efficiency", type=float, default=None, help="fraction of peak large matmuls reach")
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per optimizer step")
    parser.add_argument("--cp", type=int, nargs="+", default=[1], help="context-parallel degrees to search")
    parser.add_argument("--top", type=int, default=5, help="how many feasible layouts to print")
    parser.add_argument("--json", action="store_true", help="print JSON: one object, or a list when searching")
    args = parser.parse_args(argv)
    try:
        if args.top < 1 or args.global_batch < 1:
            raise ValueError("--top and --global-batch must be >= 1")
        if args.model is None and args.layers is None:
            args.model = "gpt3-6.7b"
        m = model_from_args(args)
        layout = Layout.parse(args.layout) if args.layout is not None else None
        c = cluster_from_args(args, layout.gpus if layout else None)
        if min(c.memory_bytes, c.intra[1], c.nic[1], c.nics, c.efficiency) <= 0:
            raise ValueError("memory, link rates, adapters and efficiency must be positive")
        if layout is None and any(cp < 1 or c.gpus % cp for cp in args.cp):
            raise ValueError(f"every --cp must divide the cluster's {c.gpus} GPUs, got {args.cp}")
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if layout is not None:
        p = plan(m, c, layout, args.global_batch)
        print(json.dumps(p.to_dict(), indent=2) if args.json else p.summary())
        return 0
    feasible, rejected = search(m, c, args.global_batch, cps=tuple(args.cp))
    if args.json:
        print(json.dumps([p.to_dict() for p in feasible[: args.top]], indent=2))
        return 0
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


def describe_step_parts(plans: dict[str, Plan]) -> str:
    """The text alternative of chapter 14a's bars of predicted step time: each named layout's step
    as compute, exposed communication and pipeline bubble, in seconds, and whether it fits."""
    bars = "; ".join(
        f"{name}: {p.step_s:.2f} s = compute {p.compute_s:.2f} + exposed communication {p.exposed_comm_s:.2f} + "
        f"bubble {p.bubble_s:.2f}{'' if p.fits else ' (rejected)'}"
        for name, p in plans.items()
    )
    return f"Predicted seconds per step, a bar per layout split into compute, exposed communication and bubble. {bars}."


if __name__ == "__main__":
    sys.exit(main())
