"""The decks from the slide blocks the authors wrote (tools/slide_blocks.py, tools/slide_checks.py,
tools/make_slides.py), without a browser: how blocks become slides, what the exporter makes of
them, and every lecture's slides against the format's rules. tests/browser/test_slides.py checks
in Chromium that every slide fits its frame."""

import re

import nbformat
import pytest

import make_slides
import slide_blocks
import slide_checks
from helpers import LECTURES

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="


def markdown(text: str, block: str | None = None, *more: str):
    """A markdown cell: ``text``, then a slide block per block given."""
    source = text + "".join(f"\n\n<!-- slide\n{b}\n-->" for b in (block, *more) if b is not None)
    return nbformat.v4.new_markdown_cell(source)


def figure_cell(*pngs: str, tags=("slide-figure",)):
    cell = nbformat.v4.new_code_cell("plot()", metadata={"tags": list(tags)})
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png}) for png in pngs]
    return cell


def lecture(*cells) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=list(cells))


def test_a_block_is_hidden_prose_and_the_cells_text_stays_whole():
    source = "## Why\n\nThe prose, for readers.\n\n<!-- slide\n## The gradients agree\n- a point\n-->"
    assert slide_blocks.blocks(source) == ["## The gradients agree\n- a point"]
    assert slide_blocks.prose(source) == "## Why\n\nThe prose, for readers."
    # Another comment is not a slide block, and stays in the text.
    other = "Text.\n\n<!-- slides are elsewhere -->"
    assert slide_blocks.blocks(other) == [] and slide_blocks.prose(other) == other


def test_headings_start_slides_and_a_block_without_one_adds_to_the_current_slide():
    nb = lecture(
        markdown("Intro.", "# 04 · DDP\nWhat it is about."),
        nbformat.v4.new_code_cell("setup_notebook()"),
        markdown("Why.", "## First\n- one"),
        markdown("More."),
        figure_cell(PNG),
        markdown("After the plot.", "- two, under the figure"),
        markdown("Last.", "### Second\n- three"),
    )
    before = nbformat.writes(nb)
    slides = slide_blocks.slides(nb)
    assert nbformat.writes(nb) == before, "the lecture was changed"
    assert [(s.level, s.title) for s in slides] == [(1, "04 · DDP"), (2, "First"), (3, "Second")]
    assert slides[0].markdown == "What it is about."
    assert slides[1].parts == [("markdown", "- one"), ("figure", PNG), ("markdown", "- two, under the figure")]
    assert slides[1].figures == [PNG]
    # The whole text of each markdown cell, in the notes of the slide current at it.
    assert slides[0].notes == ["Intro."]
    assert slides[1].notes == ["Why.", "More.", "After the plot."]
    assert slides[2].notes == ["Last."]


def test_text_before_the_first_block_goes_to_the_title_slide_and_a_cell_to_its_first_blocks_slide():
    nb = lecture(
        markdown("Before any block."),
        markdown("Title cell.", "# 00 · Title\nAbout."),
        markdown("Two slides from one cell.", "## A\n- a", "## B\n- b"),
    )
    slides = slide_blocks.slides(nb)
    assert slides[0].notes == ["Before any block.", "Title cell."]
    assert slides[1].notes == ["Two slides from one cell."] and slides[2].notes == []


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ([markdown("No blocks at all.")], "has no slide blocks"),
        ([markdown("Text.", "- no heading")], "has no heading"),
        ([figure_cell(PNG), markdown("T.", "# Title")], "before the first slide block"),
        ([markdown("T.", "# Title"), figure_cell()], "has no PNG output"),
    ],
)
def test_blocks_that_make_no_deck_are_errors_naming_the_lecture(cells, message):
    with pytest.raises(slide_blocks.SlideError, match=message) as error:
        slide_blocks.slides(lecture(*cells), "07a_pipeline.ipynb")
    assert "07a_pipeline.ipynb" in str(error.value)


def test_untagged_plots_stay_off_the_slides():
    nb = lecture(markdown("T.", "# Title\nAbout."), figure_cell(PNG, tags=()))
    assert slide_blocks.slides(nb)[0].figures == []


def test_the_deck_notebook_has_a_cell_per_slide_figures_side_by_side_and_the_notes():
    nb = lecture(markdown("Notes one.", "# Title\nAbout."), figure_cell(PNG, PNG), markdown("Notes two.", "- after"))
    deck = slide_blocks.deck_notebook(slide_blocks.slides(nb), "Title")
    kinds = [(c.cell_type, c.metadata["slideshow"]["slide_type"]) for c in deck.cells]
    assert kinds == [("markdown", "slide"), ("code", "-"), ("markdown", "-"), ("markdown", "notes")]
    assert deck.cells[0].source == "# Title\n\nAbout."
    assert deck.cells[0].metadata["slideshow"]["data"] == {"figures": "2"}
    assert [o["data"]["image/png"] for o in deck.cells[1].outputs] == [PNG, PNG]
    assert deck.cells[1].source == ""
    assert deck.cells[3].source == "Notes one.\n\nNotes two."
    assert deck.metadata["title"] == "Title"


def test_a_figures_text_alternative_reaches_the_deck_and_a_figure_without_one_gets_the_slides_title():
    described = figure_cell(PNG)
    described.outputs[0]["metadata"] = {"alt": "three ranks, each holding the sum"}
    other = "b3RoZXI="
    nb = lecture(markdown("Notes.", "## Sums\n- a point"), described, figure_cell(other))
    slides = slide_blocks.slides(nb)
    assert slides[0].alts == {PNG: "three ranks, each holding the sum"}
    deck = slide_blocks.deck_notebook(slides, "Title")
    assert [o["metadata"]["alt"] for o in deck.cells[1].outputs] == [
        "three ranks, each holding the sum",
        "figure: Sums",
    ]


@pytest.fixture(scope="module")
def exporter():
    return make_slides.exporter()


def test_a_deck_is_offline_in_a_1280_by_720_frame_with_notes_and_no_code_input(exporter, tmp_path):
    nb = lecture(
        markdown("The prose of the title cell.", "# 01 · `Title`\nAbout."),
        nbformat.v4.new_code_cell("secret_input = 1"),
        markdown("Prose.", "## Code\n```python\nx = 1\n```\n- one point"),
        figure_cell(PNG),
    )
    path = tmp_path / "01_title.ipynb"
    nbformat.write(nb, path)
    deck = make_slides.export(path, exporter, tmp_path)
    html = deck.read_text()
    assert deck.name == "01_title.slides.html"
    assert re.search(r"width:\s*1280,\s*height:\s*720", html)
    assert '<aside class="notes">' in html and "The prose of the title cell." in html
    assert "secret_input" not in html and "plot()" not in html
    assert f"data:image/png;base64,{PNG}" in html and 'alt="figure: Code"' in html
    # Every script and stylesheet from the vendor folder beside the deck, none from a network.
    sources = re.findall(r'<(?:script|link)[^>]*(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("vendor/node_modules/") for s in sources), sources
    # The lecture's title as its reader sees it, for the index (make_slides.write_index).
    assert "<title>01 · Title slides</title>" in html


def test_the_index_lists_the_decks_by_lecture_title(tmp_path):
    (tmp_path / "00_a.slides.html").write_text("<html><head><title>00 · Setup &amp; check slides</title>")
    (tmp_path / "01_b.slides.html").write_text("<html><head><title>01 · Why parallel slides</title>")
    index = make_slides.write_index(tmp_path).read_text()
    assert '<a href="00_a.slides.html">00 · Setup &amp; check</a>' in index
    assert index.index("00 · Setup") < index.index("01 · Why parallel")


def test_make_slides_fails_naming_a_lecture_without_blocks_and_leaves_no_stale_deck(tmp_path, capsys):
    path = tmp_path / "05_none.ipynb"
    nbformat.write(lecture(markdown("Prose only.")), path)
    stale = tmp_path / "05_none.slides.html"
    stale.write_text("an old deck")
    (tmp_path / "vendor" / "node_modules").mkdir(parents=True)
    for package in make_slides.PACKAGES:
        (tmp_path / "vendor" / "node_modules" / package.rsplit("@", 1)[0]).mkdir()
    assert make_slides.main([str(path), "--out", str(tmp_path)]) == 1
    assert "05_none.ipynb has no slide blocks" in capsys.readouterr().err
    assert not stale.exists()


def test_points_code_rows_and_math_are_told_apart():
    text = "Intro line\ngoes on.\n- one\n  continued\n1. two\n```python\nx = 1\n```\n"
    text += "| a | b |\n|---|---|\n| 1 | 2 |\n$$x$$"
    assert slide_checks.elements(text) == [
        ("point", "Intro line goes on."),
        ("point", "one continued"),
        ("point", "two"),
        ("code", "x = 1"),
        ("row", "| 1 | 2 |"),
        ("math", "$$x$$"),
    ]


def test_code_lines_must_be_the_lectures_wrapped_or_without_a_trailing_comment():
    nb = lecture(
        nbformat.v4.new_code_cell(
            "def step(model, batch):\n    loss = model(batch).mean()  # the mean, not the sum\n"
            "    dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=None)\n    return loss"
        )
    )
    known = slide_checks.lecture_code(nb)
    excerpt = (
        "def step(model, batch):\n...\nloss = model(batch).mean()\n"
        "dist.init_process_group(backend, timeout=timedelta(seconds=30),\n"
        "                        device_id=None)\n    return   loss"
    )
    assert slide_checks.foreign_lines(excerpt, known) == []
    wrapped = "dist.init_process_group(backend, \\\n    timeout=timedelta(seconds=30), device_id=None)"
    assert slide_checks.foreign_lines(wrapped, known) == []
    assert slide_checks.foreign_lines("loss = model(batch).sum()\nreturn loss", known) == ["loss = model(batch).sum()"]
    # A line cut short is not a line of the lecture.
    assert slide_checks.foreign_lines("dist.init_process_group(backend,", known) == ["dist.init_process_group(backend,"]


def test_code_of_a_script_the_lecture_shows_counts_as_its_code():
    nb = lecture(nbformat.v4.new_code_cell('show("../scripts/hello_allreduce.py", "main")'))
    assert slide_checks.normalised("dist.all_reduce(x)") in slide_checks.lecture_code(nb)
    assert slide_checks.normalised("dist.all_reduce(x)") not in slide_checks.lecture_code(lecture())


# Prose as a lecture has it, and points a condensing program made of it (the examples).
PROSE = (
    "The model is a stack of pre-norm blocks of causal self-attention and MLP; a final norm and a "
    "linear head give the logits. Each rank draws the whole batch and takes its share of it."
)


@pytest.mark.parametrize(
    "point",
    [
        "The model is a stack of pre-norm blocks of causal self-attention and MLP; a …",
        "The model is a stack of pre-norm blocks of causal self-attention and",
        "Each rank draws the whole batch and takes …",
        "Each rank draws the whole batch and takes",
    ],
)
def test_a_sentence_cut_short_is_found_with_or_without_its_ellipsis(point):
    assert slide_checks.cut_sentences(point, slide_checks.prose_units(lecture(markdown(PROSE))))


@pytest.mark.parametrize(
    "point",
    [
        "Each rank draws the whole batch and takes its share of it.",
        "Each rank draws the whole batch and takes its share of it",
        "every rank draws the whole batch, keeps its share",
        "a stack of pre-norm blocks",
        # A clause of the lecture, ending where the lecture's clause ends.
        "The model is a stack of pre-norm blocks of causal self-attention and MLP",
    ],
)
def test_a_whole_sentence_or_the_authors_own_words_are_no_cut(point):
    assert slide_checks.cut_sentences(point, slide_checks.prose_units(lecture(markdown(PROSE)))) is None


def test_problems_name_what_a_slide_breaks():
    many = "\n".join(f"- point {i}" for i in range(7))
    nb = lecture(
        markdown(PROSE, "## Not a title\n- fine"),
        nbformat.v4.new_code_cell("y = f(x)"),
        markdown("Text.", f"## Too many\n{many}"),
        markdown("Text.", "## Code\n```python\ny = f(x)\nz = g(y)\n```\n- a\n- b\n- c\n- d"),
        markdown("Text.", "## Ellipsis …\n- it goes on...\n- " + "long " * 30),
        markdown("Text.", "## Cut\n- Each rank draws the whole batch and takes\n- setup_notebook()"),
        figure_cell(PNG),
        markdown("Text.", "- a\n- b\n- c"),
    )
    found = "\n".join(slide_checks.problems(nb, slide_blocks.slides(nb)))
    for expected in [
        "is not a title slide",
        "5 slides for",
        "'Too many'): 7 points: at most 6",
        "'Code'): 4 points: at most 3 with code",
        "code the lecture does not have: 'z = g(y)'",
        "ends with an ellipsis: 'Ellipsis …'",
        "ends with an ellipsis: 'it goes on...'",
        "a point of 149 characters",
        "a sentence of the lecture cut short: 'Each rank draws the whole batch and takes'",
        "shows the setup cell (setup_notebook())",
        "'Cut'): 5 points: at most 2 with a figure",
    ]:
        assert expected in found, f"{expected!r} not in:\n{found}"


def test_notes_that_lose_a_cell_are_a_problem():
    nb = lecture(markdown("Title text.", "# T\nAbout."), markdown("Lost text."))
    slides = slide_blocks.slides(nb)
    assert not any("no slide's notes" in p for p in slide_checks.problems(nb, slides))
    slides[0].notes.remove("Lost text.")
    assert "cell 1: its text is in no slide's notes" in slide_checks.problems(nb, slides)


def test_some_deck_has_a_formula_for_the_browser_test_to_see_typeset():
    with_blocks = [p for p in LECTURES if "<!-- slide" in p.read_text()]
    assert any(re.search(r"\$[^$\n]+\$", s.markdown) for p in with_blocks for s in slide_blocks.read(p)), (
        "no formula on any slide: the browser test's math check checks nothing"
    )


@pytest.mark.parametrize("notebook", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_slides_follow_the_format(notebook):
    nb = nbformat.read(notebook, as_version=4)
    # A lecture without slide blocks fails here, named (slide_blocks.SlideError).
    slides = slide_blocks.slides(nb, notebook.name)
    found = slide_checks.problems(nb, slides)
    assert not found, f"{notebook.name}:\n" + "\n".join(found)
