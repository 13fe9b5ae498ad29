"""Chapter 03: a step-by-step explorer of the ring all-reduce, over ``collectives``' simulation."""

from __future__ import annotations

from fractions import Fraction
from html import escape

import ipywidgets as widgets
import torch

from .. import collectives
from .base import Explorer

NUMEL = 840  # divisible by every N from 1 to 8: chunks of S/N exactly


def _color(count: int, n: int) -> str:
    """White for one contribution, darker green the more ranks a chunk already sums."""
    if count >= n:
        return "#2e7d32"
    shade = int(235 - 150 * (count - 1) / max(n - 1, 1))
    return f"rgb({shade},{min(255, shade + 20)},{shade})"


def render(trace: collectives.Trace, k: int) -> str:
    """HTML for the state after ``k`` steps: the rank x chunk grid, the step's messages, bytes."""
    n = trace.world_size
    steps = trace.steps()
    table = trace.states[k]
    chunked = bool(trace.messages) and trace.messages[0].chunk is not None
    head = "".join(f"<th>chunk {c}</th>" for c in range(n)) if chunked else "<th>holds the sum of</th>"
    rows = []
    for r, row in enumerate(table):
        cells = []
        for cell in row:
            done = len(cell) == n
            style = f"background:{_color(len(cell), n)};color:{'white' if done else 'black'};padding:2px 8px"
            label = "+".join(str(i) for i in sorted(cell))
            cells.append(f'<td style="{style}">{escape(label)}</td>')
        rows.append(f"<tr><th>rank {r}</th>{''.join(cells)}</tr>")
    grid = (
        f'<table style="border-collapse:collapse;font-family:monospace"><tr><th></th>{head}</tr>{"".join(rows)}</table>'
    )

    if k == 0:
        what = "start: every rank holds only its own tensor"
    else:
        msgs = steps[k - 1]
        m0 = msgs[0]
        what = f"after {m0.phase} step {m0.step}: " + ", ".join(
            f"{m.src}&rarr;{m.dst} ({'chunk ' + str(m.chunk) if m.chunk is not None else 'all'})" for m in msgs
        )
    total = trace.results[0].numel() * trace.results[0].element_size()
    sent = [0] * n
    for msgs in steps[:k]:
        for m in msgs:
            sent[m.src] += m.nbytes
    fractions = ", ".join(f"{Fraction(b, total)}" for b in sent)
    return (
        f"<b>N = {n}, step {k} of {len(steps)}</b><br>{what}{grid}"
        f"<br>sent so far per rank, in units of S: {fractions}"
        f"<br>at the end: {Fraction(trace.bytes_sent()[0], total)} S per rank"
    )


class RingExplorer(Explorer):
    """Sliders for the world size N and the step; the ring's state after that step."""

    def __init__(self, world_size: int = 4, step: int = 0, naive: bool = False):
        super().__init__(
            {
                "naive": widgets.ToggleButtons(
                    options=[("ring: reduce-scatter + all-gather", False), ("naive: pass whole tensors", True)],
                    value=naive,
                ),
                "world_size": widgets.IntSlider(
                    value=world_size, min=2, max=8, description="ranks N", continuous_update=False
                ),
                "step": widgets.IntSlider(value=step, min=0, max=2 * (world_size - 1), description="step"),
            }
        )

    def trace(self) -> collectives.Trace:
        tensors = [torch.zeros(NUMEL) for _ in range(self.values["world_size"])]
        simulate = collectives.naive_ring_allreduce if self.values["naive"] else collectives.ring_allreduce
        return simulate(tensors)

    def before_update(self) -> None:
        last = len(self.trace().steps())
        if self.controls["step"].max != last:
            self.controls["step"].max = last  # may clamp the step, which updates the view again

    def html(self) -> str:
        trace = self.trace()
        return render(trace, min(self.values["step"], len(trace.steps())))

    def summary(self) -> str:
        return self.__repr__()

    def __repr__(self) -> str:
        kind = "naive" if self.values["naive"] else "ring"
        return f"RingExplorer({kind}, N={self.values['world_size']}, step={self.values['step']})"


def ring_allreduce_explorer(world_size: int = 4, step: int = 0, naive: bool = False) -> RingExplorer:
    """An explorer of the simulated ring all-reduce: pick N and a step, see who holds what."""
    return RingExplorer(world_size=world_size, step=step, naive=naive)
