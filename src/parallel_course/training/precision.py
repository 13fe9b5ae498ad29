"""What the capstone's trainer computes in and compiles (``train_gpt.py --dtype``, ``--float8``,
``--compile``; chapters 17a and 17b), in the dense layouts (``Layout.dense``), and what it did, for
metrics.json.

- ``--dtype bfloat16``: the forward and the loss under bfloat16 autocast (chapter 06c), the
  parameters, gradients and AdamW's state in float32.
- ``--float8``: torchao's FP8 linears (``parallel_course.float8.convert``: tensorwise dynamic
  scaling, e4m3 forward, e5m2 gradients; emulated in float32 on a CPU and on GPUs before compute
  capability 8.9). Converted before any parallelism is applied, so that tensor parallelism splits
  the FP8 linears and FSDP2 shards their weights; under FSDP2 the weights are all-gathered in eight
  bits, and their scales precomputed in one all-reduce before the first forward after every change of
  the weights (torchao's ``precompute_float8_dynamic_scale_for_fsdp``, which torchtitan calls after
  every optimizer step; here a checkpoint's load changes them too).
- ``--compile``: every block compiled (``parallel_course.compiled.compile_blocks``) once TP and
  FSDP2 have put their collectives in it, before DDP wraps the model; the graphs, graph breaks and
  recompiles counted (``CompileCounter``).

``Precision.record`` is what metrics.json keeps: ``dtype``; ``compile`` (the backend, graphs, graph
breaks, recompiles) and ``float8`` (the recipe, the converted linears), each null in a run without
the flag.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import torch

from .. import compiled, float8
from .layouts import layouts_that
from .parallelize import apply_fsdp

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# torchao's recipe as float8.convert configures it.
FLOAT8_RECIPE = "tensorwise dynamic scaling, e4m3 forward, e5m2 gradients"


@dataclass
class Precision:
    """One run's --dtype, --float8 and --compile (backend, or None), applied by its methods in the
    order build_model calls them; then what they did."""

    dtype: str = "float32"
    float8: bool = False
    compile_backend: str | None = None
    float8_linears: list[str] = field(default_factory=list)
    float8_gather: bool = False
    emulated: bool = True
    counter: compiled.CompileCounter | None = None

    @classmethod
    def of(cls, args) -> Precision:
        """A run's, from train_gpt.py's arguments (--compile's backend aot_eager by default)."""
        backend = (args.compile_backend or "aot_eager") if args.compile else None
        return cls(args.dtype, args.float8, backend)

    @staticmethod
    def refusal(args, layout) -> str | None:
        """Why train_gpt.py's --dtype, --float8, --compile cannot run as asked, in one line; None if they can."""
        asked = [flag for flag, on in (("--float8", args.float8), ("--compile", args.compile)) if on]
        asked += ["--dtype bfloat16"] if args.dtype != "float32" else []
        if args.compile_backend and not args.compile:
            return "--compile-backend needs --compile"
        if asked and not layout.dense:
            return f"{asked[0]} runs with --parallel {layouts_that('dense')}, got {layout.name}"
        if asked and args.moe_experts:
            return f"{asked[0]} runs with the dense MLP: drop --moe-experts"
        return None

    def convert(self, model: torch.nn.Module, meshes, device: torch.device) -> None:
        """--float8, before parallelize: torchao's FP8 linears; gathered in eight bits by FSDP2 where
        the layout applies it."""
        if not self.float8:
            return
        self.emulated = float8.emulate_here(device)
        self.float8_gather = meshes.layout.splits(apply_fsdp)
        float8.convert(model, emulate=self.emulated, fsdp_float8_all_gather=self.float8_gather)
        # On a 2d mesh each FP8 weight's amax is reduced over dp, then tp, and DTensor warns so at every
        # one, every step: true, and no news.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        self.float8_linears = float8.converted_linears(model)

    def compile(self, model: torch.nn.Module) -> None:
        """--compile, after parallelize and before the wrapper: every block, counted from nothing (a
        launch of several trainings compiles each afresh)."""
        if self.compile_backend is None:
            return
        compiled.reset()
        self.counter = compiled.CompileCounter(self.compile_backend)
        compiled.compile_blocks(model, self.counter)

    def autocast(self, device_type: str):
        """Where the forward and the loss run: bfloat16 autocast, or as they are (float32)."""
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=DTYPES[self.dtype])

    def keep_scales(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
        """With FP8 all-gathers: the FP8 weights' scales, all computed in one all-reduce (torchao's
        ``precompute_float8_dynamic_scale_for_fsdp``; without it, every FP8 weight's gather reduces its
        own amax), before the first forward after the weights change: at the start, and after every
        step of ``optimizer``. Not in the step itself: loading a checkpoint steps the optimizer once,
        with the weights not yet loaded, to make its state (DCP's ``_init_optim_state``), and scales
        computed then would be the unloaded weights' (NaN)."""
        if not self.float8_gather:
            return
        ao, stale = float8.import_torchao(), [True]

        def changed(*_):
            stale[0] = True

        def before_forward(*_):
            if stale[0]:
                ao.precompute_float8_dynamic_scale_for_fsdp(model)
                stale[0] = False

        optimizer.register_step_post_hook(changed)
        # Before FSDP2's own hook on the model (prepend): before any unit is gathered.
        model.register_forward_pre_hook(before_forward, prepend=True)

    def record(self) -> dict:
        """metrics.json's ``dtype``, ``compile`` and ``float8`` (null without the flag)."""
        counted = None
        if self.counter is not None:
            counted = {
                "backend": self.compile_backend,
                "graphs": self.counter.graphs,
                "graph_breaks": sum(compiled.graph_breaks().values()),
                "recompiles": self.counter.recompiles,
            }
        converted = None
        if self.float8:
            converted = {
                "recipe": FLOAT8_RECIPE,
                "emulated": self.emulated,
                "fsdp_float8_all_gather": self.float8_gather,
                "converted_linears": self.float8_linears,
            }
        return {"dtype": self.dtype, "compile": counted, "float8": converted}
