"""A figure shown in a notebook as a PNG with its text alternative: the ``alt`` in the output's
metadata (the decks and the site put it on the ``<img>``; tools/slide_blocks.py, tools/make_site.py)
and as the output's plain text, which a reader without images sees and nbval compares."""

from __future__ import annotations

import base64
from io import BytesIO


def png_output(fig, alt: str, dpi: int = 100, plain: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(data, metadata) of a display_data output holding ``fig`` as a PNG and ``alt`` as its text.
    ``plain``, if given, is the plain text instead of ``alt``: for a figure of what differs from
    machine to machine, a text that does not, so that nbval can still compare the output (it
    compares the plain text, not the metadata or the PNG)."""
    if not alt.strip():
        raise ValueError("a figure needs a text alternative that says what it shows")
    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    return {"image/png": png, "text/plain": alt if plain is None else plain}, {"alt": alt}


def show(fig, alt: str, dpi: int = 100, plain: str | None = None) -> None:
    """Display ``fig`` as a PNG whose text alternative is ``alt``, then close it (so that the
    notebook's inline backend does not show it a second time)."""
    from IPython.display import display
    from matplotlib import pyplot as plt

    data, metadata = png_output(fig, alt, dpi, plain)
    display(data, raw=True, metadata=metadata)
    plt.close(fig)
