"""Published trainings the planner was not tuned on: what ran, on what, how fast, and where it says so
(chapter 14a).

The planner's one free number, the efficiency of its presets, was fitted on Narayanan et al.'s SC21
Table 1 (``tests/unit/test_planner.py``). The runs below test it: each with its model, cluster and
layout as its source gives them, the throughput it achieved, and, where a source leaves a setting
out, the planner's assumption, stated. Achieved throughput is in tokens per second, the quantity a
source's iteration time or samples per second gives without any FLOP convention; where a source
gives only FLOP/s per GPU (Llama 3), tokens/s = FLOP/s x GPUs / FLOPs per token, with the planner's
count (PaLM's, the whole s x s square) and the other reading (the causal half) both shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import planner as P


@dataclass(frozen=True)
class PublishedRun:
    """A training that ran: ``achieved_tokens_per_s`` from ``achieved`` (the source's own figure),
    ``source`` where it stands, ``assumed`` what the source leaves out and the planner assumes."""

    name: str
    model: P.Model
    cluster: P.Cluster
    layout: P.Layout
    global_batch: int
    achieved_tokens_per_s: float
    achieved: str
    source: str
    assumed: str = ""

    def plan(self) -> P.Plan:
        return P.plan(self.model, self.cluster, self.layout, self.global_batch)


def flops_as_tokens(tflops_per_gpu: float, gpus: int, m: P.Model, causal_half: bool = False) -> float:
    """Tokens/s from a source's model TFLOP/s per GPU: FLOP/s x GPUs / FLOPs per token, counting
    attention's whole square (PaLM's convention, the planner's) or only its causal half."""
    per_token = m.flops_per_token()
    if causal_half:
        per_token -= 6 * m.layers * m.hidden * m.seq_len
    return tflops_per_gpu * 1e12 * gpus / per_token


# Jean Zay's A100 partition: 48 nodes of 8 A100 80GB, NVLink inside a node, four 100 Gb/s Omni-Path
# links per node (bigscience-workshop/bigscience, train/tr11-176B-ml/README.md, "Hardware").
JEAN_ZAY = P.cluster("a100-80gb", 48, nics=4, nic=(10e-6, 100e9 / 8))
LLAMA3 = P.model("llama3-405b")
LLAMA3_LONG = P.model("llama3-405b", seq_len=131072)
_LLAMA3_ASSUMED = (
    "interleave=2 (the paper uses an interleaved schedule and does not give V); micro=1 sequence; "
    "zero=2 accumulate=full: FSDP shards the optimizer and gradients but keeps the weights gathered "
    "from forward to backward, and accumulates fp32 gradients over the micro-batches (section 3.3.2)"
)
_LLAMA3_SOURCE = "Llama Team, The Llama 3 Herd of Models, arXiv:2407.21783, Table 4 and section 3.3.2"
_MTNLG_SOURCE = "Smith et al., Megatron-Turing NLG 530B, arXiv:2201.11990, section 2.4"
_MTNLG_ASSUMED = (
    "micro=1, zero=1 (not given; neither changes the step), no sequence parallelism or "
    "FlashAttention (2021), every block recomputed (Megatron-LM's practice then)"
)

RUNS = [
    PublishedRun(
        "BLOOM-176B, 384 A100",
        P.model("bloom-176b"),
        JEAN_ZAY,
        P.Layout.parse("tp=4,pp=12,dp=8,zero=1,micro=2,recompute=full,attention=naive,sp=0"),
        2048,
        19.561 * 2048,
        "19.561 samples/s of 2048 tokens (104.70 s per iteration of 2048; 149.77 TFLOP/s per GPU "
        "counting recomputation), iteration 85376",
        "bigscience-workshop/bigscience, train/tr11-176B-ml/README.md (Replica setup; Important "
        "checkpoints) and tr11-176B-ml.slurm (--checkpoint-activations; ZeRO-1 by its BF16 optimizer)",
        "no sequence parallelism or FlashAttention (Megatron-DeepSpeed, 2022)",
    ),
    *(
        PublishedRun(
            f"MT-NLG 530B, {8 * nodes} A100",
            P.model("mt-nlg-530b"),
            P.cluster("a100-80gb", nodes),
            P.Layout.parse(f"tp=8,pp=35,dp={nodes // 35},zero=1,micro=1,recompute=full,attention=naive,sp=0"),
            1920,
            1920 * 2048 / seconds,
            f"{seconds} s per iteration of 1920 x 2048 tokens ({tflops} TFLOP/s per GPU counting recomputation)",
            _MTNLG_SOURCE,
            _MTNLG_ASSUMED,
        )
        for nodes, seconds, tflops in ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113))
    ),
    *(
        PublishedRun(
            f"Llama 3 405B, {gpus:,} H100, {m.seq_len // 1024}K",
            m,
            P.cluster("h100-80gb", gpus // 8),
            P.Layout.parse(layout + ",zero=2,accumulate=full,micro=1,interleave=2"),
            batch,
            flops_as_tokens(tflops, gpus, m),
            f"{tflops} TFLOP/s per GPU, 16M tokens per step",
            _LLAMA3_SOURCE,
            _LLAMA3_ASSUMED,
        )
        for gpus, m, layout, batch, tflops in (
            (8192, LLAMA3, "tp=8,pp=16,dp=64", 2048, 430),
            (16384, LLAMA3, "tp=8,pp=16,dp=128", 2048, 400),
            (16384, LLAMA3_LONG, "tp=8,cp=16,pp=16,dp=8", 128, 380),
        )
    ),
]


def describe_ratios(names: list[str], ratios: list[float], fits: list[bool], band: float = 1.4) -> str:
    """The text alternative of chapter 14a's dots: each published run's predicted / achieved tokens
    per second, whether it lies within ``band`` either way, and whether its layout fits."""
    dots = "; ".join(
        f"{name}: {r:.2f}{'' if 1 / band < r < band else f', outside x{band:g}'}, "
        + ("fits" if f else "rejected for memory")
        for name, r, f in zip(names, ratios, fits, strict=True)
    )
    inside = sum(1 / band < r < band for r in ratios)
    return (
        f"Predicted / achieved tokens per second of {len(ratios)} published runs, a dot per run, the band "
        f"within x{band:g} shaded: {inside} of {len(ratios)} inside. {dots}."
    )
