"""What a lecture's slides must be, checked without a browser (tests/course/test_slide_blocks.py;
tools/make_slides.py prints the same problems as warnings while an author writes).

- a title slide (a ``#`` heading) first, at least MIN_SLIDES slides, and about one slide per
  150 words of the lecture's prose (at least one per WORDS_PER_SLIDE);
- per slide at most 6 points, 3 with code, 2 with a figure; a point at most POINT_CHARS
  characters as shown; a table at most 5 rows;
- code: at most 14 lines of at most 78 characters, and every line but ``...`` a line of the
  lecture's own code (see ``code_lines``);
- no title, point or table cell that ends with "…" or "...", and no point that is a sentence of
  the lecture cut short (``cut_sentences``): what a program that condenses prose produces;
- the setup cells never on a slide.
"""

import re
from functools import cache
from pathlib import Path

from slide_blocks import Slide, plain, prose

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
PACKAGE = ROOT / "src" / "parallel_course"
MIN_SLIDES = 6
WORDS_PER_SLIDE = 300  # the budget is about 150: a deck with half as many slides is too thin
MAX_POINTS, MAX_POINTS_WITH_CODE, MAX_POINTS_WITH_FIGURE = 6, 3, 2
POINT_CHARS = 100  # "about 90" as shown, markup left out
CODE_LINES, CODE_CHARS = 14, 78
TABLE_ROWS = 5
ELISION = "..."
# The calls of a setup cell: its cells never appear on a slide.
SETUP = ("setup_notebook()", "machine.versions()")
FENCE = re.compile(r"^\s*(```|~~~)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
SENTENCE_END = re.compile(r"(?<=[.!?:])\s+")
# A trailing comment a slide may leave out of a line of code: two spaces, then #.
TRAILING_COMMENT = re.compile(r"\s{2,}#.*$")
WRAPPED_LINES = 4  # a line of code wrapped over at most this many lines of an excerpt


def elements(markdown: str) -> list[tuple[str, str]]:
    """A slide's markdown as (kind, text) in order: "point" (a list item or a paragraph, its lines
    joined), "code" (a fenced block, without its fences), "math" (a $$ display), "row" (a table's
    body row)."""
    found, lines, i = [], markdown.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            end = next((j for j in range(i + 1, len(lines)) if FENCE.match(lines[j])), len(lines))
            found.append(("code", "\n".join(lines[i + 1 : end])))
            i = end + 1
        elif line.strip().startswith("$$"):
            end = i if line.strip().endswith("$$") and len(line.strip()) > 2 else i + 1
            while end < len(lines) and not lines[end].strip().endswith("$$"):
                end += 1
            found.append(("math", "\n".join(lines[i : end + 1])))
            i = end + 1
        elif line.strip().startswith("|"):
            end = i
            while end < len(lines) and lines[end].strip().startswith("|"):
                end += 1
            # The header and its separator are not rows.
            found += [("row", row) for row in lines[i + 2 : end]]
            i = end
        elif not line.strip() or line.lstrip().startswith("#"):
            i += 1
        else:
            # A point runs until a blank line, the next item, or a block of another kind.
            text, i = [line], i + 1
            while (
                i < len(lines)
                and lines[i].strip()
                and not LIST_ITEM.match(lines[i])
                and not FENCE.match(lines[i])
                and not lines[i].strip().startswith(("|", "$$"))
            ):
                text.append(lines[i])
                i += 1
            found.append(("point", LIST_ITEM.sub("", " ".join(t.strip() for t in text), count=1)))
    return found


def normalised(line: str) -> str:
    """A line of code without any whitespace: how an excerpt's line is compared to the lecture's."""
    return "".join(line.split())


def lecture_code(nb) -> set[str]:
    """Every line of the lecture's own code, normalised: its code cells (the %%writefile scripts
    among them), the files of scripts/ its code cells name (scripts it shows or copies) and the
    modules of the course's package they name by file (modules it shows); each line also without
    its trailing comment."""
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    code = "\n".join(sources)
    sources += [
        path.read_text(encoding="utf-8")
        for path in [*sorted(SCRIPTS.rglob("*")), *sorted(PACKAGE.rglob("*.py"))]
        if path.is_file() and re.search(rf"\b{re.escape(path.name)}\b", code)
    ]
    lines = set()
    for line in "\n".join(sources).splitlines():
        lines.add(normalised(line))
        lines.add(normalised(TRAILING_COMMENT.sub("", line)))
    lines.discard("")
    return lines


def joined(lines: list[str]) -> str:
    """Lines of an excerpt read as one line of code: normalised, the backslash that wraps a
    line (Python's or the shell's) taken off each but the last."""
    return "".join(normalised(line).removesuffix("\\") for line in lines[:-1]) + normalised(lines[-1])


def foreign_lines(excerpt: str, known: set[str]) -> list[str]:
    """The lines of a code excerpt that are not lines of ``known`` (lecture_code), ``...`` and
    blank lines aside. A line of the lecture may be wrapped over up to WRAPPED_LINES consecutive
    lines of the excerpt, with or without a backslash at the end of each."""
    lines = [line for line in excerpt.split("\n") if line.strip() and line.strip() != ELISION]

    @cache
    def fewest(i: int) -> tuple[str, ...]:
        """The fewest foreign lines in lines[i:], over the ways of reading them as lecture lines."""
        if i == len(lines):
            return ()
        ways = [(lines[i], *fewest(i + 1))]
        for j in range(i + 1, min(i + WRAPPED_LINES, len(lines)) + 1):
            if joined(lines[i:j]) in known:
                ways.append(fewest(j))
        return min(ways, key=len)

    return list(fewest(0))


def prose_units(nb) -> list[str]:
    """The lecture's prose as paragraphs and list items, each on one line (whitespace collapsed)."""
    units = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for block in re.split(r"\n\s*\n", prose(cell.source)):
            if block.lstrip().startswith("|"):
                # A table: each cell a unit.
                units += [" ".join(c.split()) for row in block.split("\n") for c in row.strip().strip("|").split("|")]
                continue
            items = re.split(r"\n(?=\s*(?:[-*+]|\d+[.)])\s)", block)
            units += [" ".join(LIST_ITEM.sub("", item, count=1).split()) for item in items]
    return [u for u in units if u]


def cut_sentences(point: str, units: list[str], min_words: int = 4) -> str | None:
    """The sentence of ``units`` that ``point`` is a cut-off start of, if any: the point (an
    ellipsis or a trailing , ; : taken off) starts a sentence of the lecture and stops in the
    middle of a clause of it (not at a , ; : . a dash or a parenthesis)."""
    head = " ".join(point.split())
    head = re.sub(r"\s*(…|\.\.\.)$", "", head).rstrip(",;:").strip()
    if len(head.split()) < min_words or head.endswith((".", "!", "?")):
        return None
    for unit in units:
        start = unit.find(head)
        while start >= 0:
            at_sentence_start = start == 0 or bool(re.search(r"[.!?:]\s+$", unit[:start]))
            rest = unit[start + len(head) :]
            # The point may end where a clause of the lecture ends (at a , ; : a dash or a parenthesis).
            goes_on = bool(rest.strip()) and not re.match(r"\s*[,;:.!?()]|\s+[-–—]\s", rest)
            if at_sentence_start and goes_on:
                return unit
            start = unit.find(head, start + 1)
    return None


def problems(nb, slides: list[Slide]) -> list[str]:
    """Everything the slides of lecture ``nb`` break, one line each (none: the deck is fine)."""
    found = []
    if slides[0].level != 1:
        found.append(f"the first slide ({slides[0].title!r}) is not a title slide (# heading)")
    words = sum(len(prose(c.source).split()) for c in nb.cells if c.cell_type == "markdown")
    wanted = max(MIN_SLIDES, words // WORDS_PER_SLIDE)
    if len(slides) < wanted:
        found.append(f"{len(slides)} slides for {words} words of prose: at least {wanted} (about one per 150 words)")
    known, units = lecture_code(nb), prose_units(nb)
    for n, slide in enumerate(slides, start=1):
        found += [f"slide {n} ({slide.title!r}): {p}" for p in slide_problems(slide, known, units)]
    notes = "\n\n".join("\n\n".join(s.notes) for s in slides)
    for i, cell in enumerate(nb.cells):
        text = prose(cell.source) if cell.cell_type == "markdown" else ""
        if text and text not in notes:
            found.append(f"cell {i}: its text is in no slide's notes")
    return found


def slide_problems(slide: Slide, known: set[str], units: list[str]) -> list[str]:
    found = []
    parts = elements(slide.markdown)
    points = [text for kind, text in parts if kind == "point"]
    code = [text for kind, text in parts if kind == "code"]
    rows = [text for kind, text in parts if kind == "row"]
    limit = MAX_POINTS_WITH_FIGURE if slide.figures else MAX_POINTS_WITH_CODE if code else MAX_POINTS
    if len(points) > limit:
        with_what = " with a figure" if slide.figures else " with code" if code else ""
        found.append(f"{len(points)} points: at most {limit}{with_what}")
    if len(rows) > TABLE_ROWS:
        found.append(f"a table of {len(rows)} rows: at most {TABLE_ROWS}")
    texts = [slide.title, *points, *(cell for row in rows for cell in row.strip().strip("|").split("|"))]
    for text in texts:
        if plain(text).endswith(("…", "...")):
            found.append(f"ends with an ellipsis: {text!r}")
    for point in points:
        if len(plain(point)) > POINT_CHARS:
            found.append(f"a point of {len(plain(point))} characters (at most {POINT_CHARS}): {point!r}")
        cut = cut_sentences(point, units)
        if cut:
            found.append(f"a sentence of the lecture cut short: {point!r} (the lecture: {cut[:120]!r})")
    for excerpt in code:
        lines = excerpt.split("\n")
        if len(lines) > CODE_LINES:
            found.append(f"a code excerpt of {len(lines)} lines (at most {CODE_LINES})")
        found += [
            f"a code line of {len(line)} characters (at most {CODE_CHARS}): {line!r}"
            for line in lines
            if len(line) > CODE_CHARS
        ]
        found += [f"code the lecture does not have: {line!r}" for line in foreign_lines(excerpt, known)]
    for call in SETUP:
        if call in slide.markdown:
            found.append(f"shows the setup cell ({call})")
    return found
