"""The course as a static website that works offline: `make site` -> build/site/index.html.

    python tools/make_site.py [--out DIR]

The pages are the course as it is stored: the README as the home page, every lecture with its
stored outputs and plots (nbconvert's HTML, the same exporter JupyterLab's "Export as HTML" uses),
every lab as a student gets it, MISTAKES.md, the instructor guide, the scripts, and the slide
decks (tools/make_slides.py). Links between them are rewritten from the repository's files
(`.ipynb`, `.md`, `.py`) to the pages; whatever a page links to inside the repository is a page
too. MathJax and require.js are the local copies the decks use (from the npm registry, once);
nothing is fetched when a page is read.
"""

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
from bs4 import BeautifulSoup
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound
from traitlets.config import Config

import make_slides

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "site"
# The decks live in slides/ of the site, with the libraries they load; the pages load the same.
SLIDES = "slides"
LIB = f"{SLIDES}/vendor/node_modules"
MATHJAX = f"{LIB}/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"
REQUIRE = f"{LIB}/requirejs/require.js"
# Where the site starts, and what it always holds even when nothing links to it.
START = ["README.md", "MISTAKES.md", "notebooks/README.md", "scripts/README.md"]
PAGES = ["notebooks/[0-9]*.ipynb", "labs/*.ipynb"]
HREF = re.compile(r'(href|src)="([^"]*)"')
TITLE = re.compile(r"^#\s+(.+)$", re.M)

STYLE = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 0 auto; padding: 0 1rem 3rem; }
pre { background: #f6f8fa; padding: .6rem; overflow-x: auto; }
code { font-family: ui-monospace, monospace; font-size: .9em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: .2rem .5rem; }
nav.course { font: 15px/2 system-ui, sans-serif; border-bottom: 1px solid #ddd; margin-bottom: 1rem; }
nav.course a { margin-right: 1.2rem; }
"""


def page_path(repo_path: str) -> str:
    """The site path of a repository file or folder (relative, POSIX)."""
    if repo_path.endswith("/") or (ROOT / repo_path).is_dir():
        return repo_path.rstrip("/") + "/index.html"
    if repo_path == "README.md":
        return "index.html"
    if repo_path.endswith("/README.md"):
        return repo_path.removesuffix("README.md") + "index.html"
    if repo_path.endswith((".ipynb", ".md")):
        return repo_path.rsplit(".", 1)[0] + ".html"
    return repo_path + ".html"


def relative(target: str, start_page: str) -> str:
    return os.path.relpath(target, os.path.dirname(start_page) or ".").replace(os.sep, "/")


def nav(page: str) -> str:
    links = [("index.html", "Parallel PyTorch"), ("MISTAKES.html", "Mistakes"), (f"{SLIDES}/index.html", "Slides")]
    items = "".join(f'<a href="{relative(t, page)}">{name}</a>' for t, name in links)
    return f'<nav class="course">{items}</nav>'


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading in a rendered Markdown file (the README links them)."""
    text = re.sub(r"<[^>]+>", "", html.unescape(heading)).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


HEADING = re.compile(r'<h([1-6]) id="([^"]*)">(.*?)</h\1>', re.S)


def plain_ids(text: str) -> str:
    """Heading ids as readers and links spell them: nbconvert percent-encodes the non-ASCII
    characters of an id ("1-%C2%B7-Buckets"), which no link written for JupyterLab matches."""
    return re.sub(r'id="([^"]*%[0-9A-F]{2}[^"]*)"', lambda m: f'id="{html.escape(unquote(m.group(1)))}"', text)


def rewrite_links(text: str, source: str, page: str, found: set[str]) -> str:
    """Links to repository files -> links to their pages (``found`` collects the files)."""

    def one(match):
        attr, url = match.groups()
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or url.startswith(("#", "data:", "mailto:")) or not parts.path:
            return match.group(0)
        if parts.path.startswith(f"{relative(SLIDES, page)}/") or "vendor/" in parts.path:
            return match.group(0)
        target = os.path.normpath(os.path.join(os.path.dirname(source), unquote(parts.path))).replace(os.sep, "/")
        if target.startswith("..") or not (ROOT / target).exists():
            # Not a file of the course: left as it is (the site test reports it as a broken link).
            return match.group(0)
        if (ROOT / target).is_dir():
            readme = f"{target}/README.md"
            target = readme if (ROOT / readme).exists() else target
        found.add(target)
        new = relative(page_path(target), page) + (f"#{parts.fragment}" if parts.fragment else "")
        return f'{attr}="{html.escape(new)}"'

    return HREF.sub(one, text)


def wrap(title: str, body: str, page: str, head: str = "") -> str:
    mathjax = relative(MATHJAX, page)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style>{head}"
        '<script type="text/x-mathjax-config">MathJax.Hub.Config({tex2jax: {inlineMath: [["$","$"], ["\\\\(","\\\\)"]],'
        " processEscapes: true}});</script>"
        f'<script src="{html.escape(mathjax)}"></script>'
        f"</head><body>{nav(page)}\n{body}\n</body></html>\n"
    )


def notebook_exporter() -> HTMLExporter:
    config = Config()
    # Replaced per page with the relative path of the local copy (see render_notebook).
    config.HTMLExporter.mathjax_url = "@MATHJAX@"
    config.HTMLExporter.require_js_url = "@REQUIRE@"
    return HTMLExporter(config=config, template_name="lab")


def with_alt_texts(body: str, nb: nbformat.NotebookNode) -> str:
    """``body`` with each figure's text alternative (the ``alt`` its output carries,
    parallel_course.figure_output.show) on its ``<img>``, in place of nbconvert's placeholder."""
    alts = [
        (f"data:image/png;base64,{out.data['image/png']}", out.metadata["alt"])
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {}) and out.get("metadata", {}).get("alt")
    ]
    if not alts:
        return body
    soup = BeautifulSoup(body, features="html.parser")
    images = soup.select("img")
    for src, alt in alts:
        img = next((i for i in images if i.get("src") == src), None)
        if img is not None:
            img["alt"] = alt
            images.remove(img)
    return str(soup)


def render_notebook(path: str, page: str, exporter: HTMLExporter) -> tuple[str, str]:
    nb = nbformat.read(ROOT / path, as_version=4)
    first = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    title = (TITLE.search(first) or re.search(r"(.+)", Path(path).stem)).group(1).strip()
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = with_alt_texts(body, nb)
    body = body.replace("@MATHJAX@", relative(MATHJAX, page)).replace("@REQUIRE@", relative(REQUIRE, page))
    deck = f"{SLIDES}/{Path(path).stem}.slides.html"
    extra = f' <a href="{relative(deck, page)}">Slides of this lecture</a>' if path.startswith("notebooks/") else ""
    body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + f"<style>{STYLE}</style>" + nav(page) + extra, body, count=1)
    return title, body


def render_markdown(path: str, page: str) -> tuple[str, str]:
    text = (ROOT / path).read_text(encoding="utf-8")
    title = (TITLE.search(text) or re.search(r"(.+)", path)).group(1).strip()
    body = markdown2html_mistune(text)
    # Also the anchor GitHub gives each heading, for links written against GitHub's rendering.
    body = HEADING.sub(lambda m: f'<a id="{github_slug(m.group(3))}"></a>{m.group(0)}', body)
    return title, wrap(title, body, page)


def render_text(path: str, page: str) -> tuple[str, str]:
    text = (ROOT / path).read_text(encoding="utf-8")
    try:
        lexer = get_lexer_for_filename(path, text)
    except ClassNotFound:
        lexer = get_lexer_for_filename("x.txt")
    formatter = HtmlFormatter(linenos="table", anchorlinenos=True, lineanchors="line")
    style = f"<style>{formatter.get_style_defs('.highlight')}</style>"
    return path, wrap(path, f"<h1>{html.escape(path)}</h1>" + highlight(text, lexer, formatter), page, style)


def build_decks(out: Path) -> None:
    """The decks, with the libraries they load, in slides/ of the site: the local copies in
    build/slides/vendor (where `make slides` keeps them, fetched there once if they are not yet)
    are linked, not fetched again."""
    vendor, built = out / SLIDES / "vendor", ROOT / "build" / "slides" / "vendor"
    if vendor.resolve() != built.resolve():
        make_slides.install_vendor(built)
        if not vendor.exists():
            shutil.copytree(built, vendor, copy_function=os.link)
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_slides.py"), "--out", str(out / SLIDES)], check=True)


def link_decks(out: Path) -> None:
    """The decks' links (the lecture's text in the speaker notes) made links of the site: to a
    file of the course, its page; to a heading of the lecture, that heading on the lecture's page."""
    for deck in sorted((out / SLIDES).glob("*.slides.html")):
        lecture = f"notebooks/{deck.name.removesuffix('.slides.html')}.ipynb"
        page = f"{SLIDES}/{deck.name}"
        on_page = relative(page_path(lecture), page)
        text = deck.read_text(encoding="utf-8")
        own = {html.unescape(i) for i in re.findall(r'id="([^"]*)"', text)}

        def to_lecture(match, own=own, on_page=on_page):
            fragment = match.group(1)
            if fragment in own or html.unescape(unquote(fragment)) in own:
                return match.group(0)
            return f'href="{on_page}#{fragment}"'

        text = re.sub(r'href="#(?!/)([^"]+)"', to_lecture, text)
        deck.write_text(rewrite_links(text, lecture, page, set()), encoding="utf-8")


def build(out: Path) -> list[str]:
    """Write the site into ``out``; return its pages (site paths)."""
    out.mkdir(parents=True, exist_ok=True)
    build_decks(out)
    link_decks(out)
    exporter = notebook_exporter()
    todo = list(START) + [p.relative_to(ROOT).as_posix() for g in PAGES for p in sorted(ROOT.glob(g))]
    done, pages = set(), []
    while todo:
        path = todo.pop(0)
        if path in done:
            continue
        done.add(path)
        page = page_path(path)
        if path.endswith(".ipynb"):
            _, text = render_notebook(path, page, exporter)
        elif path.endswith(".md"):
            _, text = render_markdown(path, page)
        else:
            _, text = render_text(path, page)
        found: set[str] = set()
        text = rewrite_links(plain_ids(text), path, page, found)
        todo += sorted(found - done)
        (out / page).parent.mkdir(parents=True, exist_ok=True)
        (out / page).write_text(text, encoding="utf-8")
        pages.append(page)
    return pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    pages = build(args.out)
    print(f"wrote {len(pages)} pages into {args.out}; open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
