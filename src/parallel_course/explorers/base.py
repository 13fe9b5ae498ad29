"""The one pattern of the course's explorers: controls -> a plain function of their values ->
the *values* of an ``HTML`` widget (text) and, for an explorer that draws, an ``Image`` (PNG).

Nothing is printed or displayed into an ``Output`` widget: a notebook cell that shows an
explorer stores the same text every time it runs, strict ``nbval`` can check it, and the figure
is there from the start. ``summary()`` gives the same numbers as plain lines, which a normal
cell can print; ``repr()`` (what a notebook stores as the cell's text) gives the settings.
"""

from __future__ import annotations

import io
from html import escape

import ipywidgets as widgets
from matplotlib.figure import Figure


def png(fig: Figure) -> bytes:
    """A figure as PNG bytes, without the software tag that would change with matplotlib."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


class Explorer(widgets.VBox):
    """Subclasses pass their controls (by name) and define ``summary()``; an explorer that draws
    also defines ``figure()``, and one whose text is richer than lines defines ``html()``."""

    draws = False  # True: an Image widget shows figure()

    def __init__(self, controls: dict[str, widgets.Widget]):
        self.controls = controls
        self.plot = widgets.Image(format="png") if self.draws else None
        self.result = widgets.HTML()
        for control in controls.values():
            control.observe(self._update, names="value")
        super().__init__([*controls.values(), *([self.plot] if self.draws else []), self.result])
        self._update()

    @property
    def values(self) -> dict:
        """The current settings, by control name."""
        return {name: control.value for name, control in self.controls.items()}

    def summary(self) -> str:
        raise NotImplementedError

    def figure(self) -> Figure:
        raise NotImplementedError

    def html(self) -> str:
        return f"<pre>{escape(self.summary())}</pre>"

    def before_update(self) -> None:
        """Adjust controls that depend on others (e.g. a slider's range) before the view."""

    def _update(self, change=None) -> None:
        self.before_update()
        if self.draws:  # the figure first: when the text has changed, both are current
            self.plot.value = png(self.figure())
        self.result.value = self.html()

    def __repr__(self) -> str:  # ipywidgets cuts it at 110 characters: keep it short
        settings = ", ".join(f"{name}={value!r}" for name, value in self.values.items())
        return f"{type(self).__name__}({settings})"
