"""torch.compile under sharding (chapter 17b): compile per block, count what the compiler did,
and count the collectives a compiled step runs.

- ``compile_blocks``: ``torch.compile`` each transformer block in place (``nn.Module.compile``),
  after ``fully_shard`` or ``parallelize_module``: the block is the unit FSDP2 gathers and TP
  splits, every block runs the same code, so one graph serves them all (torchtitan compiles its
  models this way; PyTorch's tutorial calls it regional compilation).
- ``CompileCounter``: a backend that records every graph dynamo hands it, by compile id
  (``frame/attempt``: attempt 1 and later of a frame are recompiles, a graph whose id starts with
  ``!`` is compiled autograd's backward), then passes it to a real backend; graph breaks are read
  from dynamo's counters.
- ``Collectives``: counts the collectives that run (c10d's and the functional ones a compiled
  graph calls), by name. It is a TorchDispatchMode that stands aside while torch.compile
  compiles (``ignore_compile_internals``) and sees what the compiled code runs. CommDebugMode
  does not stand aside: under it torch.compile runs the code eagerly (``TorchDispatchMode.
  ignore_compile_internals``'s documentation), so a "compiled" step under CommDebugMode compiled
  nothing, and its counts are the eager step's by construction.
- ``compiled_autograd``: the backward traced and compiled as a graph of its own, hooks included.
- ``plot_collectives``, ``plot_step_times``: the figures of the chapter.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

# The collectives by the names their ops carry: c10d's (FSDP2, DDP), the functional ones (DTensor,
# torchao's amax all-reduce, a compiled graph). Waits and barriers are not collectives of data.
COLLECTIVE = re.compile(r"all_?reduce|all_?gather|reduce_scatter|all_to_all|alltoall|broadcast")
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


def compile_blocks(model: nn.Module, backend, blocks: str = "blocks") -> int:
    """``torch.compile`` every block of ``model.<blocks>`` in place; returns how many."""
    compiled = 0
    for block in getattr(model, blocks):
        block.compile(backend=backend)
        compiled += 1
    return compiled


class CompileCounter:
    """A torch.compile backend: records each graph's compile id, then compiles it with ``backend``."""

    def __init__(self, backend: str = "aot_eager"):
        self.backend = backend
        self.ids: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.ids.append(str(torch._guards.CompileContext.current_compile_id()))
        return lookup_backend(self.backend)(gm, example_inputs)

    @property
    def graphs(self) -> int:
        """Graphs of the forward (compiled autograd's left out)."""
        return sum(not i.startswith("!") for i in self.ids)

    @property
    def recompiles(self) -> int:
        """Graphs compiled again for a frame compiled before (its guards failed): attempt 1 and later."""
        return sum(not i.startswith("!") and int(i.split("/")[1]) > 0 for i in self.ids)

    @property
    def backward_graphs(self) -> int:
        """Graphs of compiled autograd (the backward traced whole)."""
        return sum(i.startswith("!") for i in self.ids)


def graph_breaks() -> dict[str, int]:
    """The graph breaks dynamo met since the last ``reset()``, by the first line of their reason
    (torch 2.13 files them under "unimplemented", earlier releases under "graph_break")."""
    found: Counter[str] = Counter()
    for kind in ("graph_break", "unimplemented"):
        for reason, n in torch._dynamo.utils.counters[kind].items():
            found[str(reason).strip().splitlines()[0]] += n
    return dict(found)


def reset() -> None:
    """Forget every compiled graph and every count, before a run that must start from nothing."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


class Collectives(TorchDispatchMode):
    """Counts, by op name, the collectives run while open, compiled code included (see the module)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        # A DTensor's op turns into plain ops and collectives first (as CommDebugMode lets it).
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if getattr(func, "namespace", "") in NAMESPACES and COLLECTIVE.search(name):
            self.counts[name.strip("_")] += 1
        return out


@contextlib.contextmanager
def compiled_autograd(backend):
    """Backward passes inside are traced by compiled autograd and compiled with ``backend``."""
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend)):
        yield


def plot_collectives(ax, counts: dict[str, dict[str, int]]):
    """Grouped bars: for each run (x), the collectives of one step by name."""
    names = sorted({name for c in counts.values() for name in c})
    runs = list(counts)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs = [r + (i - (len(names) - 1) / 2) * width for r in range(len(runs))]
        ax.bar(xs, [counts[run].get(name, 0) for run in runs], width=width, color=f"C{i}", label=name)
    ax.set_xticks(range(len(runs)), runs, fontsize=8)
    ax.set(ylabel="calls in one step")
    ax.legend(fontsize=8)
    return ax


def plot_step_times(ax, times: dict[str, list[float]]):
    """Each run's step times (log scale): the first step of a compiled run holds its compilation."""
    for i, (label, values) in enumerate(times.items()):
        ax.plot(range(1, len(values) + 1), values, "o-", color=f"C{i}", label=label)
    steps = max(len(values) for values in times.values())
    ax.set_xticks(range(1, steps + 1))
    ax.set(yscale="log", xlabel="step", ylabel="seconds")
    ax.legend(fontsize=8)
    return ax


def describe_collectives(counts: dict[str, dict[str, int]]) -> str:
    """The text alternative of ``plot_collectives``: each run's calls in one step, by name."""
    parts = [
        label.replace("\n", ", ") + ": " + ", ".join(f"{n} {name}" for name, n in sorted(c.items()))
        for label, c in counts.items()
    ]
    return "Collectives in one step, grouped bars per run: " + "; ".join(parts) + "."


def describe_step_times(times: dict[str, list[float]]) -> tuple[str, str]:
    """The text alternative of ``plot_step_times``, with each run's times, and a plain text without
    them (the times are this machine's; nbval compares the plain text)."""
    steps = max(len(values) for values in times.values())
    head = f"Each run's time of each of {steps} steps, in seconds (log scale, this machine's)"
    spans = "; ".join(f"{label}: " + ", ".join(f"{t:.3g}" for t in values) for label, values in times.items())
    runs = "; ".join(times)
    return f"{head}: {spans}.", f"{head}, a line per run: {runs} (the times differ from machine to machine)."
