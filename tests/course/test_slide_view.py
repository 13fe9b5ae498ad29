"""The slide view of a lecture (tools/slide_view.py): short slides, the whole text in the notes."""

import nbformat
import pytest

from helpers import LECTURES
from slide_view import SLIDE_LINES, condense, height, shorten, slide_view

LONG = """### A heading

With a loss that is a **mean** over the batch, the gradient of the whole batch equals the average
of the gradients of equal shards of it. So N workers can each take one shard. A third sentence.

- **column-parallel**: rank r holds the r-th block of rows of W (a slice of the output features),
  computes its slice of y from the whole x, and an `all_gather` concatenates the slices.
- **row-parallel**: rank r holds the r-th block of columns of W and computes a partial y.

The bubble is $(p-1)/(m+p-1)$ of the step, whatever the hidden size and the number of layers are."""


def test_condense_keeps_headings_first_sentences_and_item_leads():
    short = condense(LONG)
    assert short.startswith("### A heading\n\n")
    assert "So N workers" not in short and "A third sentence" not in short
    # cut after 12 words, but not inside the parenthesis
    assert "- **column-parallel**: rank r holds the r-th block of rows of W (a slice of the output features) …" in short
    assert "- **row-parallel**: rank r holds the r-th block of columns of W and …" in short
    assert len(short.split()) < 0.75 * len(LONG.split())


@pytest.mark.parametrize(
    "text",
    ["a b c `d e f g h` i j", "a b $x + y = z$ c d e", "a b **c d e f** g", "a b [c d e](https://example.org) f g"],
)
def test_shorten_never_cuts_inside_code_math_bold_or_a_link(text):
    cut = shorten(text, 3).removesuffix(" …")
    assert cut.count("`") % 2 == 0 and cut.count("$") % 2 == 0 and cut.count("**") % 2 == 0
    assert cut.count("[") == cut.count("]") and cut.count("(") == cut.count(")")


def test_long_cells_get_notes_with_the_whole_text_and_the_notebook_is_unchanged():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(LONG, metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_markdown_cell("Short.", metadata={"slideshow": {"slide_type": "-"}}),
    ]
    before = nbformat.writes(nb)
    view = slide_view(nb)
    assert nbformat.writes(nb) == before
    kinds = [c.metadata["slideshow"]["slide_type"] for c in view.cells]
    assert kinds == ["slide", "notes", "-"]
    assert view.cells[1].source == LONG and view.cells[0].source == condense(LONG)
    assert view.cells[2].source == "Short."


def test_a_cell_that_would_overfill_its_slide_starts_one():
    tall = nbformat.v4.new_code_cell(
        "\n".join(f"x{i} = {i}" for i in range(30)), metadata={"slideshow": {"slide_type": "fragment"}}
    )
    tall.outputs = [nbformat.v4.new_output("stream", text="line\n" * 30)]
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("## Title\n\nOne line.", metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_code_cell("y = 1", metadata={"slideshow": {"slide_type": "fragment"}}),
        tall,
    ]
    kinds = [c.metadata["slideshow"]["slide_type"] for c in slide_view(nb).cells]
    assert kinds == ["slide", "fragment", "subslide"]


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_every_lecture_deck_has_notes_and_no_markdown_slide_over_budget(path):
    view = slide_view(nbformat.read(path, as_version=4))
    assert any(c.metadata.get("slideshow", {}).get("slide_type") == "notes" for c in view.cells)
    for cell in view.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if cell.cell_type == "markdown" and kind not in ("notes", "skip"):
            assert height(cell) <= SLIDE_LINES + 4, cell.source[:200]
