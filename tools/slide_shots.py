"""Screenshots of a lecture's slides, to look at a deck as its audience will see it.

    python tools/slide_shots.py notebooks/NN_name.ipynb [...]   # -> build/slide-shots/NN/01.png ...

Builds each deck (tools/make_slides.py, into build/slides), opens it in headless Chromium
(Debian's, never a downloaded one) at the frame's size, 1280 x 720, and saves one PNG per slide
with every fragment shown. What the frame clips is outlined in red on the PNG and listed: the
same measure as tests/browser/test_slides.py, which fails on it.
"""

import argparse
import shutil
import sys
from pathlib import Path

import make_slides

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "slide-shots"
WIDTH, HEIGHT = 1280, 720
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]

# Resolves once reveal.js has started, MathJax has typeset everything it was given and the
# fonts are in: the layout then stays as measured.
READY = """async () => {
  while (!(window.Reveal && Reveal.isReady() && window.MathJax && MathJax.Hub && MathJax.isReady)) {
    await new Promise(r => setTimeout(r, 50));
  }
  await new Promise(r => MathJax.Hub.Queue(r));
  // Every font the page declares (MathJax's among them), loaded now: Chromium draws text in a
  // font that is still loading invisibly, and measures it in another.
  await Promise.all([...document.fonts].map(f => f.load().catch(() => null)));
  await document.fonts.ready;
  return true;
}"""
# [h, v] of every slide, in order.
SLIDES = """() => {
  const out = [];
  [...document.querySelectorAll('.reveal .slides > section')].forEach((s, h) => {
    const subs = [...s.querySelectorAll(':scope > section')];
    (subs.length ? subs : [s]).forEach((_, v) => out.push([h, v]));
  });
  return out;
}"""
# Shows slide [h, v] with all its fragments; waits for MathJax to re-render it (the deck asks it
# to on every slide change).
SHOW = """async ([h, v]) => {
  Reveal.slide(h, v);
  Reveal.getCurrentSlide().querySelectorAll('.fragment').forEach(f => f.classList.add('visible'));
  await new Promise(r => MathJax.Hub.Queue(r));
  await document.fonts.ready;
  Reveal.layout();
  return true;
}"""
# What the frame clips on the current slide, in the frame's own pixels (reveal.js scales it to
# the window): a box or a line of text outside the frame, an image that did not load, an element
# whose content is wider than its box (a <pre>, a table, a formula that scrolls or is cut) or that
# hides content it scrolls (overflow other than visible). With mark, each is outlined in red.
MEASURE = """(mark) => {
  const W = Reveal.getConfig().width, H = Reveal.getConfig().height;
  const frame = document.querySelector('.reveal .slides').getBoundingClientRect();
  const sx = frame.width / W, sy = frame.height / H;
  const slide = Reveal.getCurrentSlide();
  const name = el => {
    const text = (el.innerText || el.textContent || el.getAttribute('src') || '').trim().replace(/\\s+/g, ' ');
    return `<${el.tagName.toLowerCase()}${el.className && typeof el.className === 'string'
      ? '.' + el.className.trim().split(/\\s+/)[0] : ''}> "${text.slice(0, 50)}"`;
  };
  const outside = r => {
    if (r.width === 0 && r.height === 0) return '';
    const left = (r.left - frame.left) / sx, right = (r.right - frame.left) / sx;
    const top = (r.top - frame.top) / sy, bottom = (r.bottom - frame.top) / sy;
    const cut = [];
    if (left < -1) cut.push(`left edge at ${left.toFixed(0)}px`);
    if (right > W + 1) cut.push(`right edge at ${right.toFixed(0)}px > ${W}`);
    if (top < -1) cut.push(`top at ${top.toFixed(0)}px`);
    if (bottom > H + 1) cut.push(`bottom at ${bottom.toFixed(0)}px > ${H}`);
    return cut.join(', ');
  };
  const flagged = [], found = [];
  const flag = (el, why, content = false) => flagged.push([el, why, content]);
  // The slide's own box holds its padding: what is inside it is measured.
  const elements = [...slide.querySelectorAll('*')].filter(el => !el.closest('aside.notes'));
  for (const el of elements) {
    if (el.getClientRects().length === 0) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || el.closest('.MJX_Assistive_MathML')) continue;
    const cut = outside(el.getBoundingClientRect());
    if (cut) { flag(el, cut); continue; }
    if (el.tagName === 'IMG' && !(el.complete && el.naturalWidth > 0)) { flag(el, 'image not loaded'); continue; }
    const wide = el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0;
    const tall = el.scrollHeight > el.clientHeight + 1 && el.clientHeight > 0;
    const code = el.matches('pre, code, table, .highlight, .MathJax_Display, .MJXc-display, .MathJax_CHTML, .MathJax');
    const hides = style.overflowX !== 'visible' || style.overflowY !== 'visible';
    if (wide && (code || hides)) flag(el, `content ${el.scrollWidth}px wide in a ${el.clientWidth}px box`, true);
    else if (tall && hides) flag(el, `content ${el.scrollHeight}px tall in a ${el.clientHeight}px box`, true);
  }
  // Lines of text: a word that runs past its box's edge leaves the box inside the frame.
  const walker = document.createTreeWalker(slide, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim() || node.parentElement.closest('aside.notes, .MJX_Assistive_MathML')) continue;
    if (node.parentElement.getClientRects().length === 0) continue;
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) {
      const cut = outside(r);
      if (cut) { flag(node.parentElement, `text ${cut}`); break; }
    }
  }
  // One line per thing to change: the innermost element whose content is wider than its box,
  // not what sticks out of it; else the innermost of nested elements clipped alike.
  const inside = (a, b) => a !== b && a.contains(b);
  for (const [el, why, content] of flagged) {
    if (content ? flagged.some(([o, , c]) => c && inside(el, o))
        : flagged.some(([o, , c]) => (c && inside(o, el)) || inside(el, o))) continue;
    found.push(`${name(el)}: ${why}`);
    if (mark) el.style.outline = '3px solid red';
  }
  return [...new Set(found)];
}"""


def open_deck(page, deck: Path) -> list[list[int]]:
    """Load ``deck`` in ``page`` and wait until it is laid out; the [h, v] of each of its slides."""
    page.goto(deck.as_uri())
    page.wait_for_selector(".reveal.ready", timeout=30_000)
    page.evaluate(READY)
    return page.evaluate(SLIDES)


def clipped(page, where: list[int], mark: bool = False) -> list[str]:
    """What the frame clips on slide ``where`` ([h, v]) of the deck open in ``page``."""
    page.evaluate(SHOW, where)
    return page.evaluate(MEASURE, mark)


def shoot(page, deck: Path, into: Path) -> dict[str, list[str]]:
    """One PNG per slide of ``deck`` in ``into`` (01.png, 02.png ...); slide -> what is clipped."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    problems = {}
    for n, where in enumerate(open_deck(page, deck), start=1):
        found = clipped(page, where, mark=True)
        page.screenshot(path=str(into / f"{n:02d}.png"))
        if found:
            problems[f"{n:02d}.png (#/{where[0]}/{where[1]})"] = found
    return problems


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="lectures, e.g. notebooks/00_setup_check.ipynb")
    parser.add_argument("--out", type=Path, default=SHOTS, help="where the PNGs go (default: build/slide-shots)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("slide_shots needs Debian's chromium: sudo apt-get install chromium")
    make_slides.install_vendor()
    slides, clips = make_slides.exporter(), 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        for notebook in args.notebooks:
            deck = make_slides.export(notebook, slides)
            into = args.out / notebook.name.split("_")[0]
            problems = shoot(page, deck, into)
            print(f"{notebook.name}: {len(list(into.glob('*.png')))} slides in {into}")
            for slide, found in problems.items():
                clips += 1
                print(f"  {slide} clips:", *found, sep="\n    ")
        browser.close()
    return 1 if clips else 0


if __name__ == "__main__":
    sys.exit(main())
