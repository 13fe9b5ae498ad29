"""Build each lecture's reveal.js deck from the slide blocks its authors wrote; the decks work offline.

    python tools/make_slides.py [notebooks/NN_name.ipynb ...] [--out DIR]   # DIR: build/slides

A deck holds what the lecture's slide blocks say (tools/slide_blocks.py): per slide a title, the
author's points, code excerpts and figures; the lecture's whole text in the speaker notes (press S).
A lecture without slide blocks is an error naming it.

nbconvert's decks load reveal.js, MathJax, jQuery and require.js from CDNs; without a network they
render as one flat page with raw $$. This script installs local copies from the npm registry once
(into DIR/vendor, about 80 MB, mostly MathJax), points the deck at them with relative URLs, and
uses a template (tools/slides_template) that drops mermaid and sets the 1280 x 720 frame.
Open DIR/index.html, or any deck, straight from disk.
"""

import argparse
import contextlib
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from nbconvert import SlidesExporter
from traitlets.config import Config

import slide_blocks
import slide_checks

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "slides"
TEMPLATE_DIR = ROOT / "tools" / "slides_template"
# What nbconvert 7.17's reveal template asks for (the versions it would load from CDNs).
PACKAGES = ["reveal.js@4.0.2", "mathjax@2.7.7", "jquery@2.2.4", "requirejs@2.3.7"]
# Where a deck finds them, relative to its own folder (install_vendor(DIR / "vendor")).
LIB = "vendor/node_modules"
OPTIONS = {
    "reveal_url_prefix": f"{LIB}/reveal.js",
    "mathjax_url": f"{LIB}/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    "jquery_url": f"{LIB}/jquery/dist/jquery.min.js",
    "require_js_url": f"{LIB}/requirejs/require.js",
    "reveal_theme": "white",  # its fonts ship with reveal.js (others use Google Fonts)
    "reveal_width": "1280",
    "reveal_height": "720",
}
TITLE = re.compile(r"<title>(.*?) slides</title>", re.DOTALL)


def installed(vendor: Path) -> bool:
    return all((vendor / "node_modules" / p.rsplit("@", 1)[0]).is_dir() for p in PACKAGES)


def install_vendor(vendor: Path = OUT / "vendor") -> None:
    """reveal.js, MathJax, jQuery and require.js in ``vendor``/node_modules, from the npm registry
    unless they are there already. A deck finds them in the folder ``vendor`` beside it.

    npm installs into a folder of its own, renamed to ``vendor`` when complete: another process
    (the site's build, a test on another worker) never finds a half-installed MathJax there, whose
    missing files would keep every formula of a page waiting."""
    if installed(vendor):
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("make slides needs npm (Node.js) once, to fetch reveal.js and MathJax for offline use")
    partial = vendor.with_name(f"{vendor.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"installing {' '.join(PACKAGES)} into {vendor} (once)", flush=True)
    try:
        subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(partial),
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                *PACKAGES,
            ],
            check=True,
        )
        # An incomplete folder of an interrupted older install is replaced; a complete one that
        # another process renamed in meanwhile is kept.
        if vendor.is_dir() and not installed(vendor):
            shutil.rmtree(vendor)
        with contextlib.suppress(OSError):
            partial.rename(vendor)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def exporter() -> SlidesExporter:
    """nbconvert's slides exporter with the course's template and local copies of the libraries
    (one exporter, in this process, for every deck). It shows no code cell's input: the only code
    cells of a deck's notebook hold figures (slide_blocks.deck_notebook)."""
    config = Config()
    config.TemplateExporter.extra_template_basedirs = [str(TEMPLATE_DIR.parent)]
    config.TemplateExporter.exclude_input = True
    config.TemplateExporter.exclude_input_prompt = True
    config.TemplateExporter.exclude_output_prompt = True
    for name, value in OPTIONS.items():
        setattr(config.SlidesExporter, name, value)
    return SlidesExporter(config=config, template_name=TEMPLATE_DIR.name)


def export(notebook: Path, slides: SlidesExporter, out: Path = OUT) -> Path:
    """The deck of one lecture, ``out``/NN_name.slides.html; slide_blocks.SlideError when the
    lecture's blocks cannot make one (none at all, a figure before the first slide...)."""
    lecture = slide_blocks.read(notebook)
    deck_nb = slide_blocks.deck_notebook(lecture, title=slide_blocks.plain(lecture[0].title))
    body, _ = slides.from_notebook_node(deck_nb, resources={"metadata": {"name": notebook.stem}})
    deck = out / f"{notebook.stem}.slides.html"
    deck.write_text(body, encoding="utf-8")
    return deck


def deck_title(deck: Path) -> str:
    """The lecture's title a deck was made with (its <title>), else its file's name."""
    m = TITLE.search(deck.read_text(encoding="utf-8")[:4000])
    return html.unescape(m.group(1)).strip() if m else deck.name.removesuffix(".slides.html")


def write_index(out: Path = OUT) -> Path:
    """``out``/index.html: every deck in ``out``, by lecture title, in the lectures' order."""
    items = "\n".join(
        f'<li><a href="{html.escape(d.name)}">{html.escape(deck_title(d))}</a></li>'
        for d in sorted(out.glob("*.slides.html"))
    )
    index = out / "index.html"
    index.write_text(
        "<!DOCTYPE html>\n<html lang='en'><meta charset='utf-8'><title>Parallel PyTorch slides</title>\n"
        f"<h1>Parallel PyTorch slides</h1>\n<ul>\n{items}\n</ul>\n</html>\n",
        encoding="utf-8",
    )
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="lectures (default: every lecture)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the decks go (default: build/slides)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    install_vendor(out / "vendor")
    slides, failed = exporter(), []
    for nb in notebooks:
        deck = out / f"{nb.stem}.slides.html"
        try:
            export(nb, slides, out)
        except slide_blocks.SlideError as error:
            # No stale deck of a lecture whose blocks do not make one.
            deck.unlink(missing_ok=True)
            failed.append(nb)
            print(f"error: {error}", file=sys.stderr)
            continue
        print(f"wrote {deck}")
        # What tests/course/test_slide_blocks.py will fail on, said while the author writes.
        lecture = nbformat.read(nb, as_version=4)
        for problem in slide_checks.problems(lecture, slide_blocks.slides(lecture, nb.name)):
            print(f"  warning: {problem}")
    if not args.notebooks:
        # A full build: drop the decks of lectures that no longer exist.
        for stale in set(out.glob("*.slides.html")) - {out / f"{nb.stem}.slides.html" for nb in notebooks}:
            stale.unlink()
    write_index(out)
    if failed:
        print(f"{len(failed)} lecture(s) without a deck: {', '.join(nb.name for nb in failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
