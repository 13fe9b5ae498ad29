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

from slide_view import slide_view

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "slides"
VENDOR = OUT / "vendor"
TEMPLATE_DIR = ROOT / "tools" / "slides_template"
# What nbconvert 7.17's reveal template asks for (the versions it would load from CDNs).
PACKAGES = ["reveal.js@4.0.2", "mathjax@2.7.7", "jquery@2.2.4", "requirejs@2.3.7"]
LIB = "vendor/node_modules"
OPTIONS = [
    f"--SlidesExporter.reveal_url_prefix={LIB}/reveal.js",
    f"--SlidesExporter.mathjax_url={LIB}/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    f"--SlidesExporter.jquery_url={LIB}/jquery/dist/jquery.min.js",
    f"--SlidesExporter.require_js_url={LIB}/requirejs/require.js",
    "--SlidesExporter.reveal_scroll=True",
    "--SlidesExporter.reveal_theme=white",  # its fonts ship with reveal.js (others use Google Fonts)
]


def install_vendor() -> None:
    if all((VENDOR / "node_modules" / p.rsplit("@", 1)[0]).is_dir() for p in PACKAGES):
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("make slides needs npm (Node.js) once, to fetch reveal.js and MathJax for offline use")
    VENDOR.mkdir(parents=True, exist_ok=True)
    print(f"installing {' '.join(PACKAGES)} into {VENDOR.relative_to(ROOT)} (once)", flush=True)
    subprocess.run(
        [npm, "install", "--prefix", str(VENDOR), "--no-save", "--no-audit", "--no-fund",
         "--loglevel=error", *PACKAGES],
        check=True,
    )


def export(notebook: Path) -> Path:
    # The deck is made from the slide view (tools/slide_view.py): short slides, full text in notes.
    # It is written beside the notebook's own folder level, so relative links resolve the same.
    view = OUT / "src" / notebook.name
    view.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(slide_view(nbformat.read(notebook, as_version=4)), view)
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "slides",
         f"--TemplateExporter.extra_template_basedirs={TEMPLATE_DIR.parent}",
         f"--template={TEMPLATE_DIR.name}", *OPTIONS,
         "--output-dir", str(OUT), str(view)],
        check=True, capture_output=True, text=True,
    )
    return OUT / (notebook.stem + ".slides.html")


def write_index(decks: list[Path]) -> None:
    items = "\n".join(
        f'<li><a href="{d.name}">{html.escape(d.name.removesuffix(".slides.html"))}</a></li>'
        for d in decks
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
    decks = []
    for nb in notebooks:
        decks.append(export(nb))
        print(f"wrote {decks[-1].relative_to(ROOT)}")
    if not args.notebooks:  # a full build: drop decks of lectures that no longer exist
        for stale in set(OUT.glob("*.slides.html")) - set(decks):
            stale.unlink()
    write_index(sorted(OUT.glob("*.slides.html")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
