"""Memory measured (chapter 16): torch's own trackers on the capstone's layouts, selective activation
checkpointing with torch's API, and activations offloaded with saved-tensor hooks.

- **Trackers** (``torch.distributed._tools``, torch 2.13): ``MemTracker`` is a dispatch mode that
  sees every tensor an operation makes, and ``FSDPMemTracker`` adds FSDP2's own kinds (sharded and
  gathered parameters, the all-gather and reduce-scatter buffers). Each files a storage under a kind
  (parameter, gradient, optimizer state, activation: made in forward, temporary: made in backward)
  and keeps the largest total it saw, with what each kind held at that moment (``peak_parts``). On
  a CPU the bytes are exact (``numel x element_size``; on a GPU rounded up to the allocator's 512).
  A tracker's context covers one iteration: ``reset_mod_stats()`` between two (``track_layout``).
- **Selective activation checkpointing** (``torch.utils.checkpoint.create_selective_checkpoint_contexts``):
  a policy says, for every operation of a checkpointed block's forward, whether its output is kept
  or recomputed in backward. ``every_second_matmul_policy`` is torchtitan's per-op policy (it keeps
  the outputs of attention and of the 1st, 3rd, ... matrix product, recomputes the rest);
  ``checkpoint_blocks`` wraps a GPT's blocks with it.
- **Offload** (``Offload``): a pair of saved-tensor hooks that copy every activation autograd saves
  to the host in forward and back to the device in backward, counting the bytes each way; the
  weights stay (they are on the device anyway).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed._tools import FSDPMemTracker, MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from . import planner, transformer_memory
from .gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum
from .training.layouts import LAYOUTS
from .training.parallelize import parallelize, sequence_share, wrap
from .training.step_metrics import local

# The trackers' kinds, gathered into the parts the accounting models: "other" is what no formula
# of chapter 11 counts (FSDP's gathered copies and collective buffers, tensors given from outside).
PARTS = {
    "Parameter": "parameters",
    "Sharded Param": "parameters",
    "Buffer": "other",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temporaries",
    "Unsharded Param": "other",
    "All Gather": "other",
    "Reduce Scatter": "other",
    "Other": "other",
}
PART_NAMES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")
# The problems per step in the tracked trainings (as chapter 13a's runs: 8 positions each).
GLOBAL_BATCH = 16


def peak_parts(tracker: MemTracker, moment: str = "peak", device: torch.device | str | None = None) -> dict[str, int]:
    """The tracker's snapshot (``moment``: "peak" or "current") of one device (the only one when
    None): bytes by kind, as the tracker names them, and ``Total``. On a GPU, AdamW's step counters
    stay on the CPU: another device of the snapshot."""
    snapshot = tracker.get_tracker_snapshot(moment)
    if device is None:
        if len(snapshot) != 1:
            raise ValueError(f"name the device: the snapshot has {sorted(map(str, snapshot))}")
        (kinds,) = snapshot.values()
    else:
        kinds = snapshot.get(torch.device(device), {"Total": 0})
    return {getattr(kind, "value", kind): n for kind, n in kinds.items()}


def by_part(kinds: dict[str, int]) -> dict[str, int]:
    """A snapshot's kinds added up into PART_NAMES, and ``total``."""
    parts = dict.fromkeys(PART_NAMES, 0)
    for kind, n in kinds.items():
        if kind != "Total":
            parts[PARTS[kind]] += n
    parts["total"] = kinds["Total"]
    return parts


def least(ranks: list[dict], moment: str = "peak") -> dict[str, int]:
    """Of every rank's steps after the first (which makes AdamW's state), the snapshot ``moment``
    ("peak" or "after_forward") with the smallest total: the steady figure. On gloo a collective's
    buffers are let go by gloo's own thread once the collective completes, so a step whose peak (or
    forward's end) falls before that counts them too, now and then; the smallest of the steps does
    not. ranks: track_layout's results, one per rank."""
    steps = [step[moment] for run in ranks for step in run["peaks"][1:]]
    if not steps:
        raise ValueError("no step after the first: track at least 2 iterations")
    return min(steps, key=lambda kinds: kinds["Total"])


def tracker_for(model: torch.nn.Module, optimizer) -> MemTracker:
    """FSDPMemTracker for a model FSDP2 sharded, MemTracker (told about the model and optimizer made
    before it) for any other."""
    if isinstance(model, FSDPModule):
        return FSDPMemTracker(model, optimizer)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def local_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(elements, tensors) of the parameters this rank stores (a DTensor's local shard)."""
    params = list(model.parameters())
    return sum(local(p).numel() for p in params), len(params)


def ddp_bucket_bytes(wrapper) -> int:
    """Bytes of DDP's gradient buckets (the flat buffers its all-reduce works on), 0 without DDP."""
    reducer = getattr(wrapper, "reducer", None)
    if reducer is None:
        return 0
    return sum(b.buffer().numel() * b.buffer().element_size() for b in reducer._get_zeros_like_grad_buckets())


def track_layout(
    name: str, device: torch.device | str = "cpu", global_batch: int = GLOBAL_BATCH, iterations: int = 3, seed: int = 0
) -> dict:
    """The capstone's GPT in layout ``name`` (parallel_course.training, on the process group this
    process has joined, as train_gpt.py builds it), trained ``iterations`` steps of AdamW on addition,
    each step under the layout's tracker, reset between steps. Returns each step's peak by kind and
    what the kinds held at the end of its forward, this rank's parameter elements and tensors, the
    positions it holds, and DDP's bucket bytes."""
    device = torch.device(device)
    meshes = LAYOUTS[name].meshes(device.type, dist.get_world_size())
    torch.manual_seed(seed)
    model = GPT(GPTConfig()).to(device)
    parallelize(model, meshes)
    wrapper = wrap(model, meshes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    task, data = AdditionTask(2), torch.Generator().manual_seed(seed + 1)
    dp_rank, per_rank = meshes["dp"].get_local_rank(), global_batch // meshes.size("dp")
    tracker, peaks = tracker_for(model, optimizer), []
    for _ in range(iterations):
        x, y = task.batch(data, global_batch)
        # This rank's rows, copied (as .to(device) copies them to a GPU): the rank holds only its own.
        x, y = (t[dp_rank * per_rank : (dp_rank + 1) * per_rank].clone() for t in (x, y))
        x, y, positions = sequence_share(x.to(device), y.to(device), meshes)
        with tracker:
            loss_sum, _ = answer_loss_sum(wrapper(x, positions), y)
            after_forward = peak_parts(tracker, "current", device=x.device)
            loss_sum.backward()
            optimizer.step()
            optimizer.zero_grad()
        peaks.append({"peak": peak_parts(tracker, device=x.device), "after_forward": after_forward})
        tracker.reset_mod_stats()
    elements, tensors = local_parameters(model)
    return {
        "layout": name,
        "device": device.type,
        "mesh": meshes.dims,
        "tokens": int(x.numel()),
        "positions": int(x.shape[1]),
        "peaks": peaks,
        "parameter_elements": elements,
        "parameter_tensors": tensors,
        "ddp_bucket_bytes": ddp_bucket_bytes(wrapper),
    }


# --- the tracked figures beside the accounting ----------------------------------------------------

_CFG, _TASK = GPTConfig(), AdditionTask(2)
# The capstone's GPT as the planner describes a model (no dropout), and as chapter 11's accounting does.
CAPSTONE = planner.Model(
    "the capstone's GPT",
    layers=_CFG.n_layers,
    hidden=_CFG.d_model,
    heads=_CFG.n_heads,
    vocab=_CFG.vocab_size,
    seq_len=_TASK.seq_len,
    ffn=_CFG.mlp_ratio * _CFG.d_model,
    dropout=False,
)
CAPSTONE_SHAPE = transformer_memory.Shape(_CFG.n_layers, _CFG.d_model, _CFG.n_heads, _CFG.vocab_size)


def accounted_layout(name: str, global_batch: int = GLOBAL_BATCH) -> tuple[planner.Layout, dict]:
    """A tracked layout of the capstone on 2 processes (single: 1) as the planner writes it, and as
    chapter 11's accounting (transformer_memory.per_rank_bytes) takes it."""
    half = global_batch // 2
    layouts = {
        "single": (
            planner.Layout(micro_batch=global_batch),
            dict(layout="ddp", world_size=1, tp=1, micro_batch=global_batch),
        ),
        "ddp": (planner.Layout(dp=2, micro_batch=half), dict(layout="ddp", world_size=2, tp=1, micro_batch=half)),
        "fsdp": (
            planner.Layout(dp=2, zero=3, micro_batch=half),
            dict(layout="fsdp", world_size=2, tp=1, micro_batch=half),
        ),
        # train_gpt.py's tp gathers the logits (loss replicated) and has no sequence parallelism.
        "tp": (
            planner.Layout(tp=2, micro_batch=global_batch, sp=False, loss="replicated"),
            dict(layout="tp", world_size=2, tp=2, micro_batch=global_batch),
        ),
        "cp": (
            planner.Layout(cp=2, micro_batch=global_batch),
            dict(layout="ddp", world_size=2, tp=1, micro_batch=global_batch, cp=2),
        ),
    }
    if name not in layouts:
        raise ValueError(f"layout must be one of {sorted(layouts)}, got {name!r}")
    return layouts[name]


def accounting(name: str, global_batch: int = GLOBAL_BATCH) -> dict[str, dict[str, float]]:
    """Bytes per rank by part (PART_NAMES' first five and other) as the two models count them:
    ``chapter 11``, ZeRO's accounting in fp32 (4 + 4 + 8 bytes per parameter of
    transformer_memory's count) and Korthikanti's activations (transformer_memory.per_rank_bytes);
    ``planner``, planner.memory_per_gpu (bf16 weights and gradients, fp32 master weights and Adam:
    2 + 2 + 12 bytes; FlashAttention; the logits with the activations)."""
    layout, args = accounted_layout(name, global_batch)
    params = transformer_memory.parameters_per_rank(
        CAPSTONE_SHAPE, args["layout"], args["world_size"], args["tp"], args.get("cp", 1)
    )
    ch11 = transformer_memory.per_rank_bytes(CAPSTONE_SHAPE, seq_len=CAPSTONE.seq_len, precision="fp32", **args)
    plan = planner.memory_per_gpu(CAPSTONE, layout)
    return {
        "chapter 11": {
            "parameters": 4 * params,
            "gradients": 4 * params,
            "optimizer": 8 * params,
            "activations": ch11["activations"],
            "temporaries": 0.0,
            "other": ch11["buffers"],
        },
        "planner": {
            "parameters": plan["weights"],
            "gradients": plan["gradients"],
            "optimizer": plan["optimizer"],
            "activations": plan["activations"] + plan["logits"],
            "temporaries": 0.0,
            "other": plan["buffers"],
        },
    }


def forward_leaves(name: str, tokens: int, positions_tracked: bool, ddp_bucket_bytes: int = 0) -> dict[str, int]:
    """What a rank's forward leaves in memory for backward, part by part, in fp32, for the capstone's
    GPT on ``tokens`` positions (all its sequences' together): ``blocks``, the planner's terms
    (planner.activation_terms: its 16-bit tensors twice, its fp32 softmax statistics as they are);
    ``norm statistics``, each LayerNorm's mean and 1/std (8 bytes per position; neither formula
    counts them); ``outside the blocks``, the final norm's input, its output (the head's input) and
    statistics, and the log-probabilities the loss keeps; ``ids and loss``, the token ids (int64)
    the embedding keeps, the positions (int64) when made in the forward, the loss's two scalars;
    ``DDP buckets``, when DDP made them in that forward (its second: it rebuilds them)."""
    layout, _ = accounted_layout(name)
    m = CAPSTONE
    per_position = sum(
        (nbytes if term == "softmax statistics" else 2 * nbytes) / (layout.tp if kind == "tp" or layout.sp else 1)
        for term, (nbytes, kind) in planner.activation_terms(m, layout).items()
    )
    return {
        "blocks": int(per_position * tokens * m.layers),
        "norm statistics": 8 * tokens * 2 * m.layers,
        "outside the blocks": tokens * (4 * m.hidden + 4 * m.hidden + 8 + 4 * m.vocab),
        "ids and loss": 8 * tokens + (8 * m.seq_len if positions_tracked else 0) + 8,
        "DDP buckets": ddp_bucket_bytes,
    }


# --- selective activation checkpointing ----------------------------------------------------------

MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
# What attention runs as (SDPA's CPU kernel, and the GPU ones): its output is always kept.
ATTENTION = tuple(
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(torch.ops.aten, name)
)


def every_second_matmul_policy(matmuls=MATMULS):
    """torchtitan's per-op policy (``_get_custom_policy`` of its activation checkpointing): keep the
    outputs of attention and of the 1st, 3rd, 5th, ... matrix product of each forward, recompute
    everything else. The count restarts in each checkpointed forward and again in its recomputation
    (the context tells them apart). ``matmuls``: which operations count as matrix products; a
    Linear with a bias runs as ``aten.addmm``, one without as ``aten.mm``."""
    counts = {}

    def policy(ctx, func, *args, **kwargs):
        if func in ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        if func in matmuls:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] = counts.get(key, 0) + 1
            return CheckpointPolicy.MUST_SAVE if counts[key] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def checkpoint_blocks(model: GPT, policy_factory=None) -> GPT:
    """Every block of the GPT checkpointed, in place (torch's checkpoint_wrapper, non-reentrant):
    wholly (policy_factory None: only the block's input kept), or selectively, a fresh policy from
    policy_factory for each forward (its matmul count starts at 0 in each block)."""
    context_fn = None
    if policy_factory is not None:

        def context_fn():
            return create_selective_checkpoint_contexts(policy_factory())

    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, context_fn=context_fn) if context_fn else checkpoint_wrapper(block)
    return model


def step_costs(make_model, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One forward and backward on (x, y) of a model make_model() builds: under a MemTracker, the
    bytes of activations alive when its forward ends (what it keeps for backward), its peak and the
    gradients (flat); on a second model from make_model(), the floating-point operations
    FlopCounterMode counts (matrix products: on a CPU, none for SDPA's kernel). Apart, because the
    FLOP counter under a checkpointed backward keeps more alive than the step alone does."""
    model = make_model()
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss_sum, _ = answer_loss_sum(model(x), y)
        kept = peak_parts(tracker, "current")["Activation"]
        loss_sum.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    counted = make_model()
    with FlopCounterMode(display=False) as flops:
        answer_loss_sum(counted(x), y)[0].backward()
    return {"kept": kept, "peak": peak_parts(tracker)["Total"], "flops": flops.get_total_flops(), "grads": grads}


# --- offload -------------------------------------------------------------------------------------


class Offload:
    """Saved-tensor hooks that move each activation autograd saves to ``host`` in forward (pinned
    memory on a GPU machine, so the copy can run beside the compute) and back to its device when
    backward unpacks it, counting the bytes each way. Parameters stay where they are, unless
    ``weights_too`` (the negative control: the weights, on the device anyway for the next forward,
    travel out and back every step)."""

    def __init__(self, model: torch.nn.Module, host: str = "cpu", weights_too: bool = False):
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.host, self.weights_too = torch.device(host), weights_too
        self.bytes_out = self.bytes_back = self.tensors = 0

    def pack(self, t: torch.Tensor):
        if t.untyped_storage().data_ptr() in self.weights and not self.weights_too:
            return t
        pinned = t.device.type == "cuda"
        copy = torch.empty(t.shape, dtype=t.dtype, device=self.host, pin_memory=pinned)
        copy.copy_(t, non_blocking=pinned)
        self.bytes_out += t.numel() * t.element_size()
        self.tensors += 1
        return (t.device, copy)

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, copy = packed
        self.bytes_back += copy.numel() * copy.element_size()
        return copy.to(device, non_blocking=True)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def saved_tensor_bytes(model: torch.nn.Module, run) -> int:
    """Bytes of the activations autograd saves while run() runs (parameters excluded), counted per
    saved tensor as a hook sees them (a storage saved twice counts twice: an offload copies it twice)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = [0]

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return total[0]


def tracked(run, *external) -> tuple[object, dict[str, int]]:
    """run() under a MemTracker told about ``external`` (modules, optimizers, tensors made before):
    its result and the peak by kind."""
    tracker = MemTracker()
    tracker.track_external(*external)
    with tracker:
        result = run()
    return result, peak_parts(tracker)


@contextlib.contextmanager
def group_of_one():
    """A gloo process group of this one process (a HashStore: no port), for the layouts' functions
    in a notebook's kernel; destroyed on exit."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
