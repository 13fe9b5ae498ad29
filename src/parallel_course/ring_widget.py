"""A step-by-step explorer of the ring all-reduce (chapter 03), over ``collectives``.

Like the course's other explorers it is a box of controls and an ``HTML`` widget whose *value*
is recomputed; nothing is printed into an ``Output`` widget, so the cell that shows it stores
the same text every time and strict ``nbval`` can check it.
"""

from __future__ import annotations

from fractions import Fraction
from html import escape

import ipywidgets as widgets
import torch

from . import collectives

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
    grid = (f'<table style="border-collapse:collapse;font-family:monospace"><tr><th></th>{head}</tr>'
            f'{"".join(rows)}</table>')

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


class RingExplorer(widgets.VBox):
    """Sliders for the world size N and the step; the ring's state after that step."""

    def __init__(self, world_size: int = 4, step: int = 0, naive: bool = False):
        self.world_size = widgets.IntSlider(value=world_size, min=2, max=8, description="ranks N",
                                            continuous_update=False)
        self.step = widgets.IntSlider(value=step, min=0, max=2 * (world_size - 1), description="step")
        self.algorithm = widgets.ToggleButtons(
            options=[("ring: reduce-scatter + all-gather", False), ("naive: pass whole tensors", True)],
            value=naive,
        )
        self.view = widgets.HTML()
        for control in (self.world_size, self.step, self.algorithm):
            control.observe(self._update, names="value")
        super().__init__([self.algorithm, self.world_size, self.step, self.view])
        self._update()

    def trace(self) -> collectives.Trace:
        tensors = [torch.zeros(NUMEL) for _ in range(self.world_size.value)]
        simulate = collectives.naive_ring_allreduce if self.algorithm.value else collectives.ring_allreduce
        return simulate(tensors)

    def _update(self, change=None) -> None:
        trace = self.trace()
        last = len(trace.steps())
        if self.step.max != last:
            self.step.max = last  # may clamp step.value, which calls _update again
        self.view.value = render(trace, min(self.step.value, last))

    def __repr__(self) -> str:
        kind = "naive" if self.algorithm.value else "ring"
        return f"RingExplorer({kind}, N={self.world_size.value}, step={self.step.value})"


def ring_allreduce_explorer(world_size: int = 4, step: int = 0, naive: bool = False) -> RingExplorer:
    """An explorer of the simulated ring all-reduce: pick N and a step, see who holds what."""
    return RingExplorer(world_size=world_size, step=step, naive=naive)
