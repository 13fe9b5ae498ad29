"""Each lecture's deck (tools/make_slides.py) in Chromium: it works offline, its formulas are
typeset, it has speaker notes, and every slide, every fragment shown, fits the 1280 x 720 frame
with nothing clipped: no box or line of text outside the frame, no code, table or formula wider
than its box (tools/slide_shots.py measures it; run that to see the slides). One Chromium for
all decks; a screenshot of each deck's first slide with a formula (else its second slide), and
of every slide that does not fit, is kept in build/test-artifacts/. What the decks hold is
tested without a browser in tests/course/test_slide_blocks.py."""

import os
import re
import shutil

import nbformat
import pytest

import make_slides
import slide_shots
from browser import ARTIFACTS, REQUIRE_VAR, chromium_or_skip, launch, offline_page
from helpers import LECTURES

MATH = re.compile(r"\$[^$\n]+\$")
# The text of the slides, speaker notes, code and MathJax's own scripts left out (MathJax leaves
# a $ in code alone); and whether every
# formula MathJax found was typeset (each math/tex script has its rendered frame).
SLIDE_TEXT = """() => {
  const walker = document.createTreeWalker(document.querySelector('.reveal .slides'), NodeFilter.SHOW_TEXT);
  const parts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode())
    if (!n.parentElement.closest('aside.notes, script, .MathJax_Preview, pre, code')) parts.push(n.textContent);
  const scripts = [...document.querySelectorAll('.reveal .slides script[type^="math/tex"]')]
    .filter(s => !s.closest('aside.notes'));
  return [parts.join(' '), scripts.length, scripts.every(s => document.getElementById(s.id + '-Frame'))];
}"""


@pytest.fixture(scope="module")
def vendor():
    chromium_or_skip()
    if shutil.which("npm") is None and not (make_slides.OUT / "vendor" / "node_modules").is_dir():
        reason = "the slide test needs npm once, to fetch reveal.js and MathJax: sudo apt-get install npm"
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    make_slides.OUT.mkdir(parents=True, exist_ok=True)
    make_slides.install_vendor(make_slides.OUT / "vendor")
    return make_slides.OUT / "vendor"


@pytest.fixture(scope="module")
def chromium(vendor):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def exporter():
    return make_slides.exporter()


def clipped_slides(page, deck, shots_prefix: str) -> dict[str, list[str]]:
    """Open ``deck`` in ``page``; for each slide the frame clips, what it clips (a screenshot of it
    kept as ARTIFACTS/<shots_prefix>_<h>.png)."""
    found = {}
    # Screenshots of an earlier run's clipped slides would tell of slides fixed since.
    for old in ARTIFACTS.glob(f"{shots_prefix}_[0-9]*.png"):
        old.unlink()
    for where in slide_shots.open_deck(page, deck):
        clips = slide_shots.clipped(page, where, mark=True)
        if clips:
            found[f"#/{where[0]}/{where[1]}"] = clips
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{shots_prefix}_{where[0]:02d}.png"))
    return found


def test_the_measure_sees_what_the_frame_clips(chromium, exporter, tmp_path):
    """A deck with slides that fit (a figure taller than the frame is scaled down to fit) and
    slides that do not: a code line too long, too many points, a formula too wide (a matrix, which
    MathJax cannot break). The measure finds these three, and only them."""
    wide = "x = " + " + ".join(f"weights_{i}" for i in range(14))
    points = "\n".join(f"- point {i}, long enough to need most of a line on the slide: {i}" for i in range(16))
    formula = "$$\\begin{pmatrix}" + " & ".join(f"w_{{{i}}}" for i in range(60)) + "\\end{pmatrix}$$"
    figure = nbformat.v4.new_code_cell("plot()", metadata={"tags": ["slide-figure"]})
    # A PNG 20 px wide and 2000 px tall, drawn by the browser at its own size unless the deck limits it.
    figure.outputs = [nbformat.v4.new_output("display_data", data={"image/png": _png(20, 2000)})]
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("Fits.\n\n<!-- slide\n# Probe\n- a point that fits\n-->"),
            nbformat.v4.new_markdown_cell(f"Code.\n\n<!-- slide\n## Wide code\n```python\n{wide}\n```\n-->"),
            nbformat.v4.new_markdown_cell(f"Points.\n\n<!-- slide\n## Too many points\n{points}\n-->"),
            nbformat.v4.new_markdown_cell(f"Math.\n\n<!-- slide\n## A wide formula\n{formula}\n-->"),
            nbformat.v4.new_markdown_cell("Figure.\n\n<!-- slide\n## A tall figure\n-->"),
            figure,
        ]
    )
    notebook = tmp_path / "99_probe.ipynb"
    nbformat.write(nb, notebook)
    (tmp_path / "vendor").symlink_to(make_slides.OUT / "vendor")
    deck = make_slides.export(notebook, exporter, tmp_path)
    outside = []
    page = offline_page(chromium, outside, slide_shots.WIDTH, slide_shots.HEIGHT)
    found = clipped_slides(page, deck, "slides_probe")
    page.close()
    assert sorted(found) == ["#/1/0", "#/2/0", "#/3/0"], found
    assert any("wide" in clip for clip in found["#/1/0"]), found["#/1/0"]
    assert any("bottom" in clip for clip in found["#/2/0"]), found["#/2/0"]
    assert any("mjx" in clip and "wide" in clip for clip in found["#/3/0"]), found["#/3/0"]
    assert not outside


def _png(width: int, height: int) -> str:
    """A grey PNG of that size, base64, made without an imaging library."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return base64.b64encode(png).decode()


@pytest.mark.parametrize("notebook", LECTURES, ids=[p.stem for p in LECTURES])
def test_deck_fits_the_frame_offline(chromium, exporter, notebook):
    # A lecture without slide blocks fails here, named (slide_blocks.SlideError).
    deck = make_slides.export(notebook, exporter)
    outside = []
    page = offline_page(chromium, outside, slide_shots.WIDTH, slide_shots.HEIGHT)
    clipped = clipped_slides(page, deck, f"slides_{notebook.stem}")
    text, formulas, typeset = page.evaluate(SLIDE_TEXT)
    assert typeset, f"{notebook.name}: a formula MathJax did not typeset"
    assert not MATH.search(text), f"{notebook.name}: untypeset formula left on a slide: {MATH.search(text)[0]}"
    assert page.locator(".reveal aside.notes").count() > 0, f"{notebook.name}: the deck has no speaker notes"
    # One screenshot to look at: the first slide with a formula, else the second slide.
    first_math = page.evaluate(
        """() => { const top = [...document.querySelectorAll('.reveal .slides > section')];
           const h = top.findIndex(s => s.querySelector(':scope > section > :not(aside) .MathJax_CHTML'));
           return h < 0 ? Math.min(1, top.length - 1) : h; }"""
    )
    slide_shots.clipped(page, [first_math, 0])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"slides_{notebook.stem}.png"))
    page.close()
    assert not outside, f"requests left the machine: {outside}"
    assert not clipped, f"{notebook.name}: slides the 1280 x 720 frame clips (#/h/v: what) {clipped}"
