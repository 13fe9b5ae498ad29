"""Eight-bit floats for training (chapter 17a): the two formats, scaling, and torchao's recipe.

- The formats: ``e4m3`` (``torch.float8_e4m3fn``: 4 exponent bits, 3 stored mantissa bits, no
  infinities, ±448) for what the forward multiplies, ``e5m2`` (``torch.float8_e5m2``: 5 and 2,
  ±57344) for gradients, as the FP8 formats paper assigns them (Micikevicius et al. 2022,
  arXiv:2209.05433). ``representable`` enumerates a format's 256 bit patterns; ``format_row``
  reads its range and precision from them.
- Scaling: a cast multiplies by a scale first, so that a tensor's largest magnitude (its *amax*)
  lands on the format's largest value. ``scale_for`` computes it per tensor, per row, or per block
  of 32 elements as a power of two (the OCP Microscaling (MX) specification v1.0, section 6.3);
  ``census`` counts what a cast does to a tensor (overflow, flushed to zero, subnormal);
  ``CastCensus`` counts it for every linear layer of a model while it trains, with dynamic scales and
  with delayed ones (from the amaxes of earlier steps).
- The recipe by hand (``Float8LinearByHand``): torchao's tensorwise dynamic scaling written out,
  with an unscaled cast as the negative control; and torchao itself (``import_torchao``,
  ``convert``): which linears it converts (``float8_filter``) and counts them.
- What FSDP2 all-gathers (``fsdp_gather_bytes``) with and without float8 weights, and the storage
  of a parameter whatever wraps it (``plain_storage``: a DTensor's shard, torchao's float8 weight).
- Plots: the formats' grids (``plot_grid``), where a model's numbers fall (``plot_census``), and
  runs' losses against a reference (``plot_deviation``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict

import torch
import torch.nn as nn

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# What each operand of a linear is cast to (torchao's default, the FP8 paper's): the forward's
# inputs and weights in e4m3 (precision), the gradients in e5m2 (range).
ROLE_FORMAT = {"activations": "e4m3", "weights": "e4m3", "gradients": "e5m2"}
# torchao's floor on an amax before dividing by it (torchao.float8.float8_utils.EPS).
EPS = 1e-12
# The log2 bins of the census histograms: |x| from 2^-48 to 2^16, one bin per power of two.
LOG2_BINS = (-48, 16)


# --- the formats --------------------------------------------------------------------------------


def precision_bits(dtype: torch.dtype) -> int:
    """Significand bits, the implicit leading one included: 4 for e4m3, 3 for e5m2, 8 for bfloat16."""
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p: the largest relative error of rounding to nearest in the format's normal range."""
    return 2.0 ** -precision_bits(dtype)


def tolerance(bfloat16_drift: float) -> float:
    """How far, relative, an FP8 run may drift from float32 and still be the same training, given how
    far a bfloat16 run of the same training drifts: times the ratio of the unit roundoffs of e5m2
    (FP8's coarser format) and bfloat16, 2^-3 / 2^-8 = 32 (chapter 17a derives it)."""
    return unit_roundoff(FORMATS["e5m2"]) / unit_roundoff(torch.bfloat16) * bfloat16_drift


def representable(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value >= 0 of an eight-bit format, ascending (float64): its 256 bit patterns
    read as the format, NaNs and infinities and the negative half left out."""
    if torch.finfo(dtype).bits != 8:
        raise ValueError(f"{dtype} is not an eight-bit format")
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
    return values[torch.isfinite(values) & (values >= 0)].unique()


def format_row(dtype: torch.dtype) -> dict:
    """A format's layout, range and precision. Eight-bit formats are read from their enumerated
    values (and must agree with ``torch.finfo``); others from ``torch.finfo``."""
    info = torch.finfo(dtype)
    mantissa = precision_bits(dtype) - 1
    row = {
        "exponent bits": info.bits - 1 - mantissa,
        "mantissa bits": mantissa,
        "max": info.max,
        "smallest normal": info.smallest_normal,
        "unit roundoff": unit_roundoff(dtype),
    }
    if info.bits == 8:
        values = representable(dtype)
        row["smallest subnormal"] = values[1].item()
        # Each positive value twice (±), zero once.
        row["finite values"] = 2 * (len(values) - 1) + 1
        if values[-1].item() != info.max:
            raise AssertionError(f"{dtype}: largest enumerated value {values[-1].item()} != finfo.max {info.max}")
    else:
        row["smallest subnormal"] = info.smallest_normal * info.eps
        # IEEE: the all-ones exponent holds the infinities and NaNs; zero once for both signs.
        row["finite values"] = 2 * (2 ** (info.bits - 1) - 2**mantissa) - 1
    return row


def relative_spacing(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, gap to the next value / value) for every positive value but the largest: 2^(1-p)
    across the normal range, growing through the subnormals to 1 at the smallest one."""
    values = representable(dtype)[1:]
    return values[:-1], (values[1:] - values[:-1]) / values[:-1]


def rounding_error(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|cast(x) - x| / |x| for each nonzero x (float64), cast to ``dtype`` and back."""
    x = x.double()
    return ((x.to(dtype).double() - x) / x).abs()


# --- scaling ------------------------------------------------------------------------------------


def amax_to_scale(amax: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """torchao's dynamic scale (``torchao.float8.float8_utils.amax_to_scale``): the format's
    largest value over the amax, divided in float64, kept as float32."""
    return (torch.finfo(dtype).max / torch.as_tensor(amax).double().clamp(min=EPS)).float()


def scale_for(x: torch.Tensor, dtype: torch.dtype, granularity: str = "tensorwise", block: int = 32) -> torch.Tensor:
    """The factor ``x`` is multiplied by before the cast, broadcastable to ``x``:

    - ``none``: 1 (the unscaled cast);
    - ``tensorwise``: one scale, max / amax of the whole tensor;
    - ``rowwise``: one per row (the last dimension's amax);
    - ``mx``: one per block of ``block`` consecutive elements of a row, a power of two:
      2^-(floor(log2 amax) - emax), emax the largest exponent of the format (8 for e4m3, 15 for
      e5m2), so the block's amax lands in [2^emax, 2^(emax+1)) (OCP MX v1.0, section 6.3; what
      lands above the format's max saturates).
    """
    if granularity == "none":
        return torch.ones((), dtype=torch.float32)
    if granularity == "tensorwise":
        return amax_to_scale(x.abs().amax(), dtype)
    if granularity == "rowwise":
        return amax_to_scale(x.abs().amax(dim=-1, keepdim=True), dtype)
    if granularity == "mx":
        if x.shape[-1] % block:
            raise ValueError(f"the last dimension ({x.shape[-1]}) is not a multiple of the block ({block})")
        amax = x.abs().unflatten(-1, (-1, block)).amax(dim=-1, keepdim=True).double().clamp(min=EPS)
        emax = math.floor(math.log2(torch.finfo(dtype).max))
        scale = torch.exp2(emax - torch.floor(torch.log2(amax))).float()
        return scale.expand(*amax.shape[:-1], block).flatten(-2)
    raise ValueError(f"granularity must be none, tensorwise, rowwise or mx, got {granularity!r}")


def cast(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """x times its scale, saturated to the format's range, cast to eight bits (torchao's
    ``to_fp8_saturated``: e4m3 saturates by itself in torch 2.12 and later, e5m2 would become inf)."""
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype)


def quantize(x: torch.Tensor, dtype: torch.dtype, granularity: str = "tensorwise") -> torch.Tensor:
    """What the matmul sees of ``x``: cast with its scale, then divided by it again (float32)."""
    scale = scale_for(x, dtype, granularity)
    return cast(x, dtype, scale).float() / scale


def census(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | float = 1.0) -> dict[str, int]:
    """What a cast with ``scale`` does to the elements of ``x``: ``overflow`` (beyond what rounds to
    the format's largest value: saturated, or inf without saturation), ``flushed`` (nonzero, cast to zero),
    ``subnormal`` (kept with fewer significant bits than the format's precision), of ``total``."""
    info = torch.finfo(dtype)
    scaled = (x.float() * scale).abs()
    kept = scaled.to(dtype) != 0
    # Beyond what rounds to the largest value: more than half the last gap above it.
    top, below = representable(dtype)[-2:].tolist()[::-1]
    return {
        "overflow": int((scaled > top + (top - below) / 2).sum()),
        "flushed": int(((x != 0) & ~kept).sum()),
        "subnormal": int((kept & (scaled < info.smallest_normal)).sum()),
        "total": x.numel(),
    }


def log2_histogram(x: torch.Tensor) -> torch.Tensor:
    """Counts of the nonzero |x| per power of two, over ``LOG2_BINS`` (values outside go to the
    end bins)."""
    low, high = LOG2_BINS
    exponents = torch.floor(torch.log2(x[x != 0].abs().double())).clamp(low, high - 1)
    return torch.bincount((exponents - low).long(), minlength=high - low)


class CastCensus:
    """Counts what eight-bit casts would do to the operands of every linear that FP8 would convert
    (``float8_filter``) while a model trains.

    For each role (``activations``: the inputs, ``weights``, ``gradients``: the gradient of the
    output, what backward multiplies) and each way of scaling (``unscaled``; ``dynamic``: the
    tensor's own amax, as torchao does; ``delayed``: the largest amax of the same tensor in the
    last ``history`` steps, as delayed scaling computes a scale before the tensor exists, the
    current amax only on a tensor's first step), the sums of ``census`` in the role's format
    (``ROLE_FORMAT``), and a ``log2_histogram`` of the values. Use as a context manager around the
    training; the hooks are removed on exit.
    """

    SCALINGS = ("unscaled", "dynamic", "delayed")

    def __init__(self, model: nn.Module, history: int = 16):
        self.model, self.history = model, history
        self.counts = {(r, s): defaultdict(int) for r in ROLE_FORMAT for s in self.SCALINGS}
        self.histograms = {r: torch.zeros(LOG2_BINS[1] - LOG2_BINS[0], dtype=torch.long) for r in ROLE_FORMAT}
        self.amaxes: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._handles = []

    def record(self, name: str, role: str, x: torch.Tensor) -> None:
        x = x.detach()
        dtype = FORMATS[ROLE_FORMAT[role]]
        past = self.amaxes[(name, role)]
        amax = x.abs().amax()
        delayed = max(past[-self.history :]) if past else amax.item()
        past.append(amax.item())
        scales = {"unscaled": 1.0, "dynamic": amax_to_scale(amax, dtype), "delayed": amax_to_scale(delayed, dtype)}
        for scaling, scale in scales.items():
            for key, n in census(x, dtype, scale).items():
                self.counts[(role, scaling)][key] += n
        self.histograms[role] += log2_histogram(x)

    def __enter__(self) -> CastCensus:
        for name, module in self.model.named_modules():
            if float8_filter(module):
                self._handles.append(module.register_forward_pre_hook(self._forward(name)))
                self._handles.append(module.register_full_backward_hook(self._backward(name)))
        return self

    def _forward(self, name):
        def hook(module, args):
            self.record(name, "activations", args[0])
            self.record(name, "weights", module.weight)

        return hook

    def _backward(self, name):
        def hook(module, grad_input, grad_output):
            self.record(name, "gradients", grad_output[0])

        return hook

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def share(self, role: str, scaling: str, what: str) -> float:
        """The share of a role's elements that a way of scaling overflowed, flushed or left subnormal."""
        counts = self.counts[(role, scaling)]
        return counts[what] / counts["total"]


# --- the recipe by hand, and torchao's ------------------------------------------------------------


class _Float8Matmul(torch.autograd.Function):
    """y = x wᵀ with both operands cast to e4m3, and in backward the output's gradient cast to e5m2
    for both gradient products: torchao's tensorwise dynamic recipe emulated in float32
    (``Float8Linear`` with ``emulate=True``: each product is float32 on the cast values)."""

    @staticmethod
    def forward(ctx, x, weight, granularity):
        e4m3 = FORMATS["e4m3"]
        x8 = quantize(x, e4m3, granularity)
        w8 = quantize(weight, e4m3, granularity)
        ctx.save_for_backward(x8, w8)
        ctx.granularity = granularity
        return x8 @ w8.t()

    @staticmethod
    def backward(ctx, grad):
        x8, w8 = ctx.saved_tensors
        g8 = quantize(grad, FORMATS["e5m2"], ctx.granularity)
        return g8 @ w8, g8.t() @ x8, None


class Float8LinearByHand(nn.Linear):
    """An ``nn.Linear`` whose matmuls are FP8's (``_Float8Matmul``): ``granularity`` "tensorwise"
    is torchao's default recipe, "none" the unscaled cast."""

    granularity = "tensorwise"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Float8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, self.granularity)
        y = y.view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def float8_filter(module: nn.Module, fqn: str = "") -> bool:
    """Which linears take FP8 matmuls: both dimensions multiples of 16, what FP8 tensor cores need
    (the first rule of torchao's ``_auto_filter_for_recipe``; its second, skipping the layers too small
    to gain on an H100, would skip every layer of a small model: the planner's ``float8_linear_times``
    says why)."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def by_hand(model: nn.Module, granularity: str = "tensorwise") -> int:
    """Swap every linear that ``float8_filter`` passes for a ``Float8LinearByHand`` with the same
    weights, in place; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and float8_filter(child):
                new = Float8LinearByHand(
                    child.in_features, child.out_features, bias=child.bias is not None, device=child.weight.device
                )
                new.load_state_dict(child.state_dict())
                new.granularity = granularity
                setattr(parent, name, new)
                swapped += 1
    return swapped


@contextlib.contextmanager
def _quiet(*names: str):
    """Loggers raised to ERROR for a while: torchao's import logs the CUDA extensions it cannot load on
    a CPU build (with their absolute paths), and torch logs a deprecation on torchao's behalf."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def import_torchao():
    """``torchao.float8``, imported with its import-time log lines silenced (nothing else hidden)."""
    with _quiet("torchao", "torch.utils._pytree"):
        import torchao.float8

    return torchao.float8


def emulate_here(device: torch.device) -> bool:
    """Whether FP8 matmuls must be emulated: everywhere but a CUDA GPU of compute capability 8.9 or
    newer (Ada, Hopper, Blackwell: ``torch._scaled_mm``'s FP8 kernels)."""
    return not (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9))


def convert(model: nn.Module, *, emulate: bool, fsdp_float8_all_gather: bool = False) -> int:
    """torchao's ``convert_to_float8_training`` on the linears ``float8_filter`` passes, tensorwise
    dynamic scaling; with ``fsdp_float8_all_gather`` FSDP2 gathers their weights in eight bits.
    Returns how many linears were converted."""
    ao = import_torchao()
    config = ao.Float8LinearConfig(emulate=emulate, enable_fsdp_float8_all_gather=fsdp_float8_all_gather)
    ao.convert_to_float8_training(model, config=config, module_filter_fn=float8_filter)
    return len(converted_linears(model))


def converted_linears(model: nn.Module) -> list[str]:
    """The names of the linears that compute in FP8 (torchao's ``Float8Linear`` or the course's)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, Float8LinearByHand) or type(module).__name__ == "Float8Linear":
            found.append(name)
    return found


def plain_storage(p: torch.Tensor):
    """The untyped storage of the plain tensor under a parameter or an activation: a DTensor's local
    shard, torchao's float8 weight wrapper's tensor, the eight-bit data of torchao's float8 tensor
    (what FSDP2 gathers in FP8, what an FP8 linear keeps for backward; wrappers whose own
    ``untyped_storage()`` raises), or the tensor itself."""
    while True:
        if hasattr(p, "to_local"):
            p = p.to_local()
        elif hasattr(p, "_tensor") and isinstance(p._tensor, torch.Tensor):
            p = p._tensor
        elif hasattr(p, "__tensor_flatten__"):
            # Another tensor subclass made of tensors (torchao's Float8TrainingTensor: _data, _scale):
            # its first, the data.
            p = getattr(p, p.__tensor_flatten__()[0][0])
        else:
            return p.untyped_storage()


# --- the chapter's training run ------------------------------------------------------------------


def capstone(seed: int = 0) -> nn.Module:
    """Chapter 11's GPT with the same initial weights every time."""
    from .gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig())


def train(
    model: nn.Module,
    steps: int,
    *,
    batch: int = 64,
    lr: float = 3e-3,
    data_seed: int = 1,
    rank: int = 0,
    world_size: int = 1,
    bf16: bool = False,
    loss_scale: float = 1.0,
    after_step=None,
) -> list[float]:
    """The chapter's training: AdamW on batches of 2-digit sums, the same batches in every run.

    Each of ``world_size`` ranks takes its rows of every global batch of ``batch`` problems and
    backpropagates its summed loss x world_size / the global count of answer tokens (FSDP2 and DDP
    average the gradients over the ranks); returns the global mean loss of every step (all-reduced).
    ``bf16``: the forward under bfloat16 autocast. ``loss_scale``: the loss multiplied by it and
    AdamW's epsilon too, which leaves AdamW's steps unchanged in exact arithmetic while every
    gradient is ``loss_scale`` times smaller, as a batch ``1 / loss_scale`` times larger makes them.
    ``after_step(model)`` runs at the end of each step, after the optimizer's and the loss's all-reduce.
    """
    import torch.distributed as dist

    from .gpt import AdditionTask, answer_loss_sum

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-8 * loss_scale)
    task, generator = AdditionTask(2), torch.Generator().manual_seed(data_seed)
    device = next(model.parameters()).device
    share = batch // world_size
    losses = []
    for _ in range(steps):
        x, y = (t[rank * share : (rank + 1) * share].to(device) for t in task.batch(generator, batch))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss_sum, count = answer_loss_sum(logits.float(), y)
        # Every problem has the same number of answer digits: the global count is the local one x N.
        optimizer.zero_grad()
        (loss_sum * loss_scale / count).backward()
        optimizer.step()
        total = loss_sum.detach()
        if world_size > 1:
            dist.all_reduce(total)
        losses.append(total.item() / (count * world_size))
        if after_step is not None:
            after_step(model)
    return losses


# --- FSDP2's all-gather -------------------------------------------------------------------------


def fsdp_gather_bytes(
    params: dict[str, torch.Tensor], world_size: int, float8: set[str] = frozenset(), element_size: int = 4
) -> int:
    """Bytes one rank hands to one FSDP2 all-gather of a unit's parameters: each parameter's shard,
    dim 0 split into ``world_size`` parts padded to equal size (FSDP2 pads), ``element_size`` bytes
    an element (the parameter dtype, or MixedPrecisionPolicy's), 1 for the names in ``float8``.
    Mixed dtypes travel as one uint8 buffer of the same bytes (FSDP2's
    ``_get_all_gather_input_metadatas``)."""
    total = 0
    for name, p in params.items():
        rows = p.shape[0] if p.dim() else 1
        shard = math.ceil(rows / world_size) * (p.numel() // max(rows, 1))
        total += shard * (1 if name in float8 else element_size)
    return total


# --- plots --------------------------------------------------------------------------------------


def plot_grid(ax, formats: dict[str, torch.dtype]):
    """Each format's positive values (x, log scale) against the relative gap to the next one (y):
    the flat part is the normal range (2^(1-p)), the rising part the subnormals."""
    for i, (label, dtype) in enumerate(formats.items()):
        values, gaps = relative_spacing(dtype)
        ax.plot(values.numpy(), gaps.numpy(), ".", color=f"C{i}", markersize=3, label=label)
    ax.set(xscale="log", yscale="log", xlabel="value", ylabel="gap to the next value / value")
    ax.legend(fontsize=8)
    return ax


def plot_census(axes, histograms: dict[str, torch.Tensor], windows: dict[str, tuple[str, torch.dtype]]):
    """One panel per role: the histogram of log2|x| (a bar per power of two) and, shaded, the normal
    range of the role's format unscaled (``windows``: role -> (label, dtype))."""
    low, _ = LOG2_BINS
    for ax, (role, counts) in zip(axes, histograms.items()):
        edges = torch.arange(len(counts)) + low
        ax.bar(edges.numpy(), counts.numpy(), width=1.0, align="edge", color="C0")
        label, dtype = windows[role]
        info = torch.finfo(dtype)
        ax.axvspan(math.log2(info.smallest_normal), math.log2(info.max), color="C1", alpha=0.25, label=label)
        ax.set(xlabel="log2 |x|", ylabel="elements", title=role, yscale="log")
        ax.legend(fontsize=8, loc="upper left")
    return axes


def plot_deviation(ax, deviations: dict[str, list[float]], tolerance: float):
    """Each run's |loss / reference - 1| per step (log scale), and the tolerance as a line."""
    for i, (label, values) in enumerate(deviations.items()):
        steps = range(1, len(values) + 1)
        ax.plot(steps, [max(v, 1e-9) for v in values], color=f"C{i}", label=label)
    ax.axhline(tolerance, color="black", linestyle="--", label="tolerance")
    ax.set(yscale="log", xlabel="step", ylabel="|loss / float32's - 1|")
    ax.legend(fontsize=8)
    return ax


def describe_grid(formats: dict[str, torch.dtype], reference: torch.dtype | None = None) -> str:
    """The text alternative of ``plot_grid``: each format's positive values, its flat gap across
    the normal range and its largest gap in the subnormals; and ``reference``'s normal-range gap,
    if the figure marks it."""
    parts = []
    for label, dtype in formats.items():
        values, gaps = relative_spacing(dtype)
        normal = gaps[values >= torch.finfo(dtype).smallest_normal]
        parts.append(
            f"{label}: {len(values) + 1} positive values from {values[0].item():.3g} to {torch.finfo(dtype).max:.3g}, "
            f"the gap flat at {normal.max().item():.3g} of the value across the normal range, rising to "
            f"{gaps.max().item():.3g} at the smallest subnormal"
        )
    text = "Gap to the next representable value, relative to the value, against the value (both log scale). "
    text += "; ".join(parts) + "."
    if reference is not None:
        name = str(reference).removeprefix("torch.")
        text += f" A dotted line marks {name}'s largest gap, {2 * unit_roundoff(reference):.3g}."
    return text


def describe_census(histograms: dict[str, torch.Tensor], windows: dict[str, tuple[str, torch.dtype]]) -> str:
    """The text alternative of ``plot_census``: per role, the powers of two its values span and the
    share of them inside the role's format's normal range, unscaled."""
    low, high = LOG2_BINS
    parts = []
    for role, counts in histograms.items():
        label, dtype = windows[role]
        info = torch.finfo(dtype)
        exponents = torch.arange(len(counts)) + low
        seen = exponents[counts > 0]
        inside = (exponents >= math.log2(info.smallest_normal)) & (exponents < math.log2(info.max))
        share = counts[inside].sum().item() / max(counts.sum().item(), 1)
        # The end bins also hold what lies beyond them (log2_histogram).
        below = " or less" if seen.min().item() == low else ""
        above = " or more" if seen.max().item() == high - 1 else ""
        parts.append(
            f"{role}: |x| from 2^{seen.min().item()}{below} to 2^{seen.max().item() + 1}{above}, {share:.0%} of "
            f"them inside the {label}"
        )
    return "Histograms of log2 |x| of the operands FP8 would cast, one panel per role. " + "; ".join(parts) + "."


def describe_deviation(deviations: dict[str, list[float]], tolerance: float) -> str:
    """The text alternative of ``plot_deviation``: each run's largest drift and whether it stays
    within the tolerance."""
    parts = [
        f"{label} at most {max(values):.2g} ({'within' if max(values) <= tolerance else 'beyond'} it)"
        for label, values in deviations.items()
    ]
    return (
        f"Each run's |loss / float32's - 1| over {len(next(iter(deviations.values())))} steps (log scale), "
        f"against the tolerance {tolerance:.2g}: " + "; ".join(parts) + "."
    )
