"""The slides a lecture's authors wrote: the slide blocks of its markdown cells, read in order.

A markdown cell may end with an HTML comment that starts with ``<!-- slide``: the slide content
its author wrote for that part of the lecture, in the author's words (readers of the notebook
never see a comment)::

    ## Why the gradients agree

    The prose of the cell, for readers ...

    <!-- slide
    ## The gradients agree
    - a mean loss: the batch's gradient is the average of its shards' gradients
    - so N workers can each take one shard and average
    -->

- A block whose first non-blank line is a heading (``#``, ``##``, ``###``) starts a new slide
  with that title; a block without one adds its content to the current slide. The lecture's
  first cell has the title slide's block: ``# NN · Title`` and one line saying what it is about.
- A code cell tagged ``slide-figure`` puts its PNG output on the current slide, without its code;
  the output's ``alt`` (``parallel_course.figure_output.show``) is the image's text alternative.
- A fenced code block in a slide block is an excerpt of the lecture's own code (``...`` marks an
  elision); the limits on points, code and tables are tools/slide_checks.py's.
- The whole text of every markdown cell, the blocks removed, becomes the speaker notes of the
  slide current at that cell: the slide its first block starts (or adds to), else the slide of
  the last block before it; the text of cells before the first block goes to the title slide.

Nothing else of the lecture reaches a slide. ``slides(nb)`` returns the slides; the notebook is
never changed. Build a deck with tools/make_slides.py, look at it with tools/slide_shots.py.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

# The comment is the block; (?=\s) so that a comment starting "<!-- slides-…" is not one.
BLOCK = re.compile(r"<!--\s*slide(?=\s)(.*?)-->", re.DOTALL)
HEADING = re.compile(r"^(#{1,3})\s+(\S.*?)\s*#*\s*$")
FIGURE_TAG = "slide-figure"


class SlideError(ValueError):
    """A lecture whose slide blocks cannot make a deck; the message names the lecture and cell."""


@dataclass
class Slide:
    title: str
    level: int
    # In order: ("markdown", text) or ("figure", base64 PNG).
    parts: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The index of the cell whose block starts the slide.
    cell: int = 0
    # A figure's text alternative, by its PNG: the ``alt`` its output carries (figure_output.show).
    alts: dict[str, str] = field(default_factory=dict)

    @property
    def markdown(self) -> str:
        """The slide's text: the markdown of its blocks after the title, figures left out."""
        return "\n\n".join(text for kind, text in self.parts if kind == "markdown")

    @property
    def figures(self) -> list[str]:
        return [png for kind, png in self.parts if kind == "figure"]


def blocks(source: str) -> list[str]:
    """The slide blocks of one markdown cell's source, each without its comment markers,
    dedented and stripped of blank lines at either end."""
    return [_dedent(m.group(1)) for m in BLOCK.finditer(source)]


def prose(source: str) -> str:
    """A markdown cell's text without its slide blocks (what its readers see)."""
    return re.sub(r"\n{3,}", "\n\n", BLOCK.sub("", source)).strip()


def _dedent(text: str) -> str:
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents, default=0)
    return "\n".join(line[cut:] for line in lines)


def split_heading(block: str) -> tuple[int, str, str] | None:
    """(level, title, the rest) when the block's first line is a ``#``-``###`` heading, else None."""
    first, _, rest = block.partition("\n")
    m = HEADING.match(first)
    if not m:
        return None
    return len(m.group(1)), m.group(2), rest.strip("\n")


def plain(text: str) -> str:
    """Markdown as its reader sees it: links as their text, no ** or backticks."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"\*\*|__|`", "", text).strip()


def figures(cell) -> list[str]:
    """The base64 PNGs of a code cell's outputs."""
    return [png for png, _ in figure_alts(cell)]


def figure_alts(cell) -> list[tuple[str, str]]:
    """The base64 PNGs of a code cell's outputs, each with its text alternative ("" if none)."""
    return [
        ("".join(out["data"]["image/png"]).replace("\n", ""), out.get("metadata", {}).get("alt", ""))
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]


def slides(nb: nbformat.NotebookNode, name: str = "the lecture") -> list[Slide]:
    """The slides of a lecture, in order; ``name`` names it in errors (SlideError)."""
    found: list[Slide] = []
    waiting: list[str] = []  # notes of the cells before the first slide
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            # The cell's text goes with its first block's slide (where its blocks start).
            home = None
            for block in blocks(cell.source):
                heading = split_heading(block)
                if heading:
                    level, title, rest = heading
                    found.append(Slide(title=title, level=level, cell=index))
                    block = rest
                elif not found:
                    raise SlideError(f"{name}, cell {index}: the first slide block has no heading (# title)")
                home = home or found[-1]
                if block.strip():
                    found[-1].parts.append(("markdown", block))
            home = home or (found[-1] if found else None)
            text = prose(cell.source)
            if text:
                (home.notes if home else waiting).append(text)
        elif FIGURE_TAG in cell.metadata.get("tags", []):
            pngs = figures(cell)
            if not pngs:
                raise SlideError(f"{name}, cell {index}: tagged {FIGURE_TAG} but has no PNG output")
            if not found:
                raise SlideError(f"{name}, cell {index}: a {FIGURE_TAG} cell before the first slide block")
            found[-1].parts += [("figure", png) for png in pngs]
            found[-1].alts.update({png: alt for png, alt in figure_alts(cell) if alt})
    if not found:
        raise SlideError(f"{name} has no slide blocks (<!-- slide ... --> in its markdown cells)")
    found[0].notes[:0] = waiting
    return found


def read(notebook: Path) -> list[Slide]:
    return slides(nbformat.read(notebook, as_version=4), notebook.name)


def deck_notebook(lecture: list[Slide], title: str) -> nbformat.NotebookNode:
    """A notebook for nbconvert's reveal.js exporter: per slide a markdown cell (its title and
    text), the figures as a code cell's outputs (the exporter leaves out every input), the text
    after a figure in a cell of its own, then the speaker notes."""
    cells = []
    for slide in lecture:
        data = {"figures": str(len(slide.figures))} if slide.figures else {}
        head = f"{'#' * slide.level} {slide.title}"
        parts = list(slide.parts)
        first = parts.pop(0)[1] if parts and parts[0][0] == "markdown" else ""
        cells.append(
            nbformat.v4.new_markdown_cell(
                f"{head}\n\n{first}".strip(), metadata={"slideshow": {"slide_type": "slide", "data": data}}
            )
        )
        for kind, content in parts:
            if kind == "markdown":
                cells.append(nbformat.v4.new_markdown_cell(content, metadata={"slideshow": {"slide_type": "-"}}))
            elif cells[-1].cell_type == "code":
                # Figures one after another stand side by side: outputs of one cell.
                cells[-1].outputs.append(_png_output(content, slide.alts.get(content, f"figure: {slide.title}")))
            else:
                cell = nbformat.v4.new_code_cell("", metadata={"slideshow": {"slide_type": "-"}})
                cell.outputs = [_png_output(content, slide.alts.get(content, f"figure: {slide.title}"))]
                cells.append(cell)
        if slide.notes:
            notes = "\n\n".join(slide.notes)
            cells.append(nbformat.v4.new_markdown_cell(notes, metadata={"slideshow": {"slide_type": "notes"}}))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["title"] = title
    # Stable output: the same deck from the same lecture, every time.
    for i, cell in enumerate(nb.cells):
        cell.id = f"slide-cell-{i}"
    return nb


def _png_output(png: str, alt: str):
    return nbformat.v4.new_output("display_data", data={"image/png": png}, metadata={"alt": alt})
