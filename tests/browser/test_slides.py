"""`make slides` decks work offline: reveal.js starts, there are slides and speaker notes, no
slide overflows its frame, math is typeset, and no request leaves the machine. A screenshot of
one slide is kept in build/test-artifacts/. The slide view itself (tools/slide_view.py) is
tested without a browser in tests/course/test_slide_view.py."""

import os
import re
import shutil
import sys
import time

import nbformat
import pytest

from browser import ARTIFACTS, REQUIRE_VAR, ROOT, chromium_or_skip, is_local, launch
from helpers import LECTURES
from parallel_course.launch import run_bounded

MATH = re.compile(r"\$[^$\n]+\$")
# Each slide's content height, laid out whether or not it is the current slide, and the frame
# reveal.js scales to the window (nbconvert's template: 960 x 700).
SLIDE_HEIGHTS = """() => {
  const frame = parseFloat(getComputedStyle(document.querySelector('.reveal .slides')).height);
  const out = [];
  [...document.querySelectorAll('.reveal .slides > section')].forEach((s, h) => {
    const subs = [...s.querySelectorAll(':scope > section')];
    (subs.length ? subs : [s]).forEach((sub, v) => {
      const saved = [s.style.display, sub.style.display];
      s.style.display = 'block'; sub.style.display = 'block';
      out.push([`#/${h}/${v}`, sub.scrollHeight]);
      [s.style.display, sub.style.display] = saved;
    });
  });
  return [frame, out];
}"""


@pytest.fixture(scope="module")
def decks():
    chromium_or_skip()
    if shutil.which("npm") is None and not (ROOT / "build/slides/vendor/node_modules").is_dir():
        reason = "the slide test needs npm once, to fetch reveal.js and MathJax: sudo apt-get install npm"
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    result = run_bounded([sys.executable, "tools/make_slides.py"], timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return {nb: ROOT / "build" / "slides" / f"{nb.stem}.slides.html" for nb in LECTURES}


def settled(page, script, timeout_s=60):
    """``script``'s result once two readings half a second apart agree (a generous deadline)."""
    deadline = time.monotonic() + timeout_s
    last = page.evaluate(script)
    while time.monotonic() < deadline:
        page.wait_for_timeout(500)
        now = page.evaluate(script)
        if now == last:
            return now
        last = now
    return last


def has_math(notebook) -> bool:
    nb = nbformat.read(notebook, as_version=4)
    return any(MATH.search(c.source) for c in nb.cells if c.cell_type == "markdown")


def test_some_lecture_has_math_to_typeset():
    assert any(has_math(nb) for nb in LECTURES), "no formula in any lecture: the math check checks nothing"


def test_every_lecture_cell_has_slide_metadata():
    for path in LECTURES:
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            kind = cell.metadata.get("slideshow", {}).get("slide_type")
            assert kind in {"slide", "subslide", "fragment", "-", "skip", "notes"}, (
                f"{path.name} cell {i}: slide_type {kind!r}"
            )


def test_setup_cells_are_skipped_in_slides():
    for path in LECTURES:
        for cell in nbformat.read(path, as_version=4).cells:
            if "setup_notebook()" in cell.source or "machine.versions()" in cell.source:
                assert cell.metadata["slideshow"]["slide_type"] == "skip", path.name


@pytest.mark.parametrize("notebook", LECTURES, ids=[p.stem for p in LECTURES])
def test_deck_works_offline(decks, notebook):
    from playwright.sync_api import sync_playwright

    outside = []
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 800})

        def guard(route):
            if is_local(route.request.url):
                route.continue_()
            else:  # never let it out; remember it to fail the test
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", guard)
        page.goto(decks[notebook].as_uri())
        page.wait_for_selector(".reveal.ready", timeout=30_000)  # reveal.js initialised
        assert page.locator(".reveal .slides section").count() > 1
        if has_math(notebook):
            page.wait_for_function("document.querySelectorAll('.MathJax_CHTML').length > 0", timeout=30_000)
            raw = page.evaluate("document.querySelector('.reveal .slides').innerText")
            assert not MATH.search(raw), f"untypeset formula left in the deck: {MATH.search(raw)[0]}"
        # Speaker notes, and every slide (all its fragments shown) within the deck's frame, measured
        # once the layout has settled (MathJax typesets formulas after reveal.js is ready).
        assert page.locator(".reveal aside.notes").count() > 0, "the deck has no speaker notes"
        frame, heights = settled(page, SLIDE_HEIGHTS)
        tall = [(where, h) for where, h in heights if h > frame]
        assert not tall, f"slides taller than the {frame}px frame (#/h/v, height): {tall}"
        if notebook.stem.startswith("01"):
            # Show the first slide with a typeset formula: reveal.js addresses it as #/h/v.
            h, v = page.evaluate(
                """() => { const top = [...document.querySelectorAll('.reveal .slides > section')];
                   for (const [h, s] of top.entries()) {
                     const subs = s.querySelectorAll(':scope > section');
                     for (const [v, sub] of (subs.length ? [...subs] : [s]).entries())
                       if (sub.querySelector('.MathJax_CHTML')) return [h, v]; }
                   return [0, 0]; }"""
            )
            page.goto(f"{decks[notebook].as_uri()}#/{h}/{v}")
            page.wait_for_timeout(1000)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"slides_{notebook.stem}.png"))
        browser.close()
    assert not outside, f"requests left the machine: {outside}"
