"""Export every lecture notebook to a reveal.js deck that works offline.

    python tools/make_slides.py [notebooks/NN_name.ipynb ...]   # -> build/slides/

nbconvert's decks load reveal.js, MathJax, jQuery, require.js and mermaid from CDNs; without a
network they render as one flat page with raw $$. This script installs local copies from the npm
registry once (into build/slides/vendor, about 80 MB, mostly MathJax), points the deck at them
with relative URLs, and uses a template (tools/slides_template) that drops mermaid.
Open build/slides/index.html, or any deck, straight from disk.
"""

import argparse
import html
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from nbconvert import SlidesExporter
from traitlets.config import Config

from slide_view import slide_view

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "slides"
VENDOR = OUT / "vendor"
TEMPLATE_DIR = ROOT / "tools" / "slides_template"
# What nbconvert 7.17's reveal template asks for (the versions it would load from CDNs).
PACKAGES = ["reveal.js@4.0.2", "mathjax@2.7.7", "jquery@2.2.4", "requirejs@2.3.7"]
LIB = "vendor/node_modules"
OPTIONS = {
    "reveal_url_prefix": f"{LIB}/reveal.js",
    "mathjax_url": f"{LIB}/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    "jquery_url": f"{LIB}/jquery/dist/jquery.min.js",
    "require_js_url": f"{LIB}/requirejs/require.js",
    "reveal_scroll": True,
    "reveal_theme": "white",  # its fonts ship with reveal.js (others use Google Fonts)
}


def install_vendor() -> None:
    if all((VENDOR / "node_modules" / p.rsplit("@", 1)[0]).is_dir() for p in PACKAGES):
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("make slides needs npm (Node.js) once, to fetch reveal.js and MathJax for offline use")
    VENDOR.mkdir(parents=True, exist_ok=True)
    print(f"installing {' '.join(PACKAGES)} into {VENDOR.relative_to(ROOT)} (once)", flush=True)
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(VENDOR),
            "--no-save",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            *PACKAGES,
        ],
        check=True,
    )


def exporter() -> SlidesExporter:
    """nbconvert's slides exporter with the course's template and local copies of the libraries
    (one exporter, in this process, for every deck)."""
    config = Config()
    config.TemplateExporter.extra_template_basedirs = [str(TEMPLATE_DIR.parent)]
    for name, value in OPTIONS.items():
        setattr(config.SlidesExporter, name, value)
    return SlidesExporter(config=config, template_name=TEMPLATE_DIR.name)


def export(notebook: Path, slides: SlidesExporter) -> Path:
    """The deck of one lecture, made from its slide view (tools/slide_view.py): short slides, the
    full text in the speaker notes."""
    view = slide_view(nbformat.read(notebook, as_version=4))
    body, _ = slides.from_notebook_node(
        view, resources={"metadata": {"name": notebook.stem, "path": str(notebook.parent)}}
    )
    deck = OUT / f"{notebook.stem}.slides.html"
    deck.write_text(body, encoding="utf-8")
    return deck


def write_index(decks: list[Path]) -> None:
    items = "\n".join(
        f'<li><a href="{d.name}">{html.escape(d.name.removesuffix(".slides.html"))}</a></li>' for d in decks
    )
    (OUT / "index.html").write_text(
        "<!DOCTYPE html><html lang='en'><meta charset='utf-8'><title>Parallel PyTorch slides</title>"
        f"<h1>Parallel PyTorch slides</h1><ul>{items}</ul></html>\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args()
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    install_vendor()
    decks, slides = [], exporter()
    for nb in notebooks:
        decks.append(export(nb, slides))
        print(f"wrote {decks[-1].relative_to(ROOT)}")
    if not args.notebooks:  # a full build: drop decks of lectures that no longer exist
        for stale in set(OUT.glob("*.slides.html")) - set(decks):
            stale.unlink()
    write_index(sorted(OUT.glob("*.slides.html")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
