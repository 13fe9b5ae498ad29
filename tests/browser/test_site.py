"""`make site`: the course as a static website that works offline. In a real browser every page
loads, every link inside the site resolves (to a page, and to its heading when it names one),
every image shows, every formula is typeset by the local MathJax, and no request leaves the
machine; every lecture, lab and MISTAKES is reachable from the home page, with its stored plots.
A screenshot of one page is kept in build/test-artifacts/."""

import html
import os
import re
import shutil
import sys
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from browser import ARTIFACTS, REQUIRE_VAR, ROOT, chromium_or_skip, launch, offline_page
from helpers import LECTURES
from parallel_course.launch import run_bounded

SITE = ROOT / "build" / "site"
MATH = re.compile(r"\$[^$\n]+\$")
# An HTML comment (the slide blocks of a lecture) is not shown: its math is not the page's.
COMMENT = re.compile(r"<!--.*?-->", re.S)
ID = re.compile(r"""\sid=(?:"([^"]*)"|'([^']*)')""")
HREF = re.compile(r"""\shref=(?:"([^"]*)"|'([^']*)')""")


def attributes(pattern: re.Pattern, text: str) -> list[str]:
    """The values of one attribute in an HTML text, quoted either way."""
    return [html.unescape(double or single) for double, single in pattern.findall(text)]


# What a reader sees of a page's prose: its text without code, outputs and scripts.
PROSE = """() => { const body = document.body.cloneNode(true);
  body.querySelectorAll('pre, code, script, style, .jp-OutputArea, .MathJax_CHTML, .MJX_Assistive_MathML')
      .forEach(e => e.remove());
  return body.innerText; }"""
# Why MathJax is not ready: its script never ran, or what it shows in its corner while it loads
# (e.g. "File failed to load: ...").
MATHJAX_STATE = """() => !window.MathJax ? 'MathJax.js did not load'
  : (document.getElementById('MathJax_Message') || {}).textContent || 'loaded, no message'"""
FACTS = """() => ({
  typeset: document.querySelectorAll('.MathJax_CHTML').length,
  broken_images: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 100)),
  images: document.images.length,
})"""


@pytest.fixture(scope="module")
def site():
    chromium_or_skip()
    if shutil.which("npm") is None and not (ROOT / "build/slides/vendor/node_modules").is_dir():
        reason = "the site test needs npm once, to fetch MathJax and reveal.js: sudo apt-get install npm"
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    result = run_bounded([sys.executable, "tools/make_site.py", "--out", str(SITE)], timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return sorted(p for p in SITE.rglob("*.html") if "vendor" not in p.relative_to(SITE).parts)


@cache
def ids_of(page: Path) -> frozenset[str]:
    return frozenset(attributes(ID, page.read_text(encoding="utf-8")))


def target_of(page: Path, href: str) -> tuple[Path, str] | None:
    """The file and heading a link inside the site points to; None for a link that leaves it."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc:
        return None
    path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    return path, parts.fragment


def broken_links(page: Path) -> list[str]:
    broken = []
    for href in attributes(HREF, page.read_text(encoding="utf-8")):
        target = target_of(page, href)
        if target is None or href.startswith("javascript:"):
            continue
        path, fragment = target
        if not path.is_file():
            broken.append(f"{href} (no such page)")
        elif fragment and path.suffix == ".html" and not {fragment, unquote(fragment)} & ids_of(path):
            # A browser looks for the fragment as written, then percent-decoded.
            broken.append(f"{href} (no heading {unquote(fragment)!r} in {path.name})")
    return broken


def test_some_page_has_math_to_typeset():
    pages = [*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "labs").glob("*.ipynb")]
    assert any(has_math(nb) for nb in pages), "no formula on any page: the math check checks nothing"


def test_every_link_inside_the_site_resolves(site):
    broken = {p.relative_to(SITE).as_posix(): b for p in site if (b := broken_links(p))}
    assert not broken, broken


def test_every_lecture_lab_and_mistakes_is_reachable_from_the_home_page(site):
    seen, todo = set(), [SITE / "index.html"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".html" or not page.is_file() or "vendor" in page.parts:
            continue
        seen.add(page)
        for href in attributes(HREF, page.read_text(encoding="utf-8")):
            target = target_of(page, href)
            if target is not None:
                todo.append(target[0])
    wanted = [SITE / "MISTAKES.html", SITE / "slides" / "index.html"]
    wanted += [SITE / "notebooks" / f"{nb.stem}.html" for nb in LECTURES]
    wanted += [SITE / "labs" / f"{lab.stem}.html" for lab in sorted((ROOT / "labs").glob("*.ipynb"))]
    wanted += [SITE / "slides" / f"{nb.stem}.slides.html" for nb in LECTURES]
    missing = [p.relative_to(SITE).as_posix() for p in wanted if p.resolve() not in seen]
    assert not missing, f"not reachable from index.html: {missing}"


def has_math(notebook: Path) -> bool:
    nb = nbformat.read(notebook, as_version=4)
    return any(MATH.search(COMMENT.sub("", c.source)) for c in nb.cells if c.cell_type == "markdown")


def stored_plots(notebook: Path) -> int:
    nb = nbformat.read(notebook, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_every_page_loads_offline_with_its_plots_and_typeset_math(site):
    from playwright.sync_api import TimeoutError as PageTimeout
    from playwright.sync_api import sync_playwright

    outside, problems = [], {}
    with sync_playwright() as p:
        browser = launch(p)
        page = offline_page(browser, outside, 1280, 900)
        for path in site:
            if path.name.endswith(".slides.html"):
                # The decks are tested in tests/browser/test_slides.py.
                continue
            name = path.relative_to(SITE).as_posix()
            errors = []

            def on_error(error, errors=errors):
                errors.append(error)

            page.on("pageerror", on_error)
            page.goto(path.as_uri(), wait_until="load")
            # Every formula typeset: MathJax runs what it queued before this callback.
            if page.locator("script[src*='MathJax.js']").count():
                try:
                    page.wait_for_function("() => window.MathJax && MathJax.Hub && MathJax.isReady", timeout=30_000)
                except PageTimeout:
                    # It takes well under a second; a file MathJax waits for in vain keeps it waiting.
                    problems[name] = [f"MathJax not ready after 30 s: {page.evaluate(MATHJAX_STATE)}"]
                    page.remove_listener("pageerror", on_error)
                    continue
                page.evaluate("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))")
            facts = page.evaluate(FACTS)
            raw = MATH.search(page.evaluate(PROSE))
            trouble = [f"untypeset formula: {raw[0]}"] if raw else []
            trouble += [f"image not shown: {src}" for src in facts["broken_images"]]
            trouble += [f"script error: {e}" for e in errors]
            notebook = ROOT / path.relative_to(SITE).with_suffix(".ipynb")
            if notebook.is_file():
                plots = stored_plots(notebook)
                if facts["images"] < plots:
                    trouble.append(f"{facts['images']} images for {plots} stored plots")
                if has_math(notebook) and not facts["typeset"]:
                    trouble.append("no formula typeset")
            if trouble:
                problems[name] = trouble
            page.remove_listener("pageerror", on_error)
        page.goto((SITE / "notebooks" / "01_why_parallel.html").as_uri())
        page.wait_for_function("() => window.MathJax && MathJax.isReady", timeout=30_000)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "site_01_why_parallel.png"))
        browser.close()
    assert not outside, f"requests left the machine: {sorted(set(outside))[:10]}"
    assert not problems, problems
