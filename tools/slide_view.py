"""The slide view of a lecture: short slides, the full text in the speaker notes.

A lecture notebook is written to be read: paragraphs of explanation. On a slide the instructor
wants the headline of each point. `slide_view(nb)` returns a copy in which every long markdown
cell on a slide keeps its headings, the first sentence of each paragraph and the lead of each
list item (tables and short code blocks stay, trimmed), and is followed by a speaker-notes cell
(reveal.js notes, nbconvert's `notes` slide type) that holds the whole cell, so nothing is lost.
The notebook itself is never changed.
"""

import copy
import re

import nbformat

LONG_WORDS = 60  # a markdown cell longer than this (or than LONG_LINES lines) is condensed
LONG_LINES = 8
SENTENCE_WORDS = 32  # a paragraph keeps its first sentence, at most this many words
ITEM_WORDS = 12  # a list item keeps its lead, at most this many words
TABLE_ROWS = 6  # a table keeps its header and this many rows
CELL_WORDS = 10  # each table cell at most this many words
CODE_LINES = 8  # a code block in markdown stays if it is this short
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*\[`$])")  # not at a colon: "Next: [a link]" stays whole
LIST_ITEM = re.compile(r"^(\s*)([-*]|\d+\.)\s+")


def _balanced(text: str) -> bool:
    """True when no inline math, code, bold or link is left open in ``text``."""
    return (
        text.count("$") % 2 == 0
        and text.count("`") % 2 == 0
        and text.count("**") % 2 == 0
        and text.count("[") == text.count("]")
        and text.count("(") == text.count(")")
    )


def shorten(text: str, max_words: int) -> str:
    """``text`` cut after at most ``max_words`` words (an ellipsis marks the cut), never inside
    `code`, $math$, **bold** or a link; longer than that only to close what it opened."""
    words = text.split()
    if len(words) <= max_words:
        return " ".join(words)
    for n in range(max_words, len(words) + 1):
        head = " ".join(words[:n])
        if _balanced(head):
            return head if n == len(words) else head.rstrip(",;:") + " …"
    return " ".join(words)


def first_sentence(text: str, max_words: int) -> str:
    for cut in SENTENCE_END.finditer(text):
        head = text[: cut.start()]
        if _balanced(head):
            return shorten(head, max_words)
    return shorten(text, max_words)


def _blocks(source: str) -> list[list[str]]:
    blocks, current, fence = [], [], False
    for line in source.splitlines():
        if line.strip().startswith("```"):
            fence = not fence
        if not line.strip() and not fence:
            if current:
                blocks.append(current)
            current = []
        else:
            current.append(line)
    if current:
        blocks.append(current)
    return blocks


def _list_items(block: list[str]) -> list[tuple[str, str]]:
    """(marker with its indent, text) per item; continuation lines joined to their item."""
    items = []
    for line in block:
        m = LIST_ITEM.match(line)
        if m:
            items.append([m.group(0), line[m.end() :]])
        elif items:
            items[-1][1] += " " + line.strip()
    return [tuple(i) for i in items]


def condense(source: str) -> str:
    """The headline version of one markdown cell."""
    out = []
    for block in _blocks(source):
        first = block[0].lstrip()
        if first.startswith("#"):
            out.append("\n".join(block))
        elif first.startswith("```"):
            if len(block) <= CODE_LINES + 2:
                out.append("\n".join(block))
        elif first.startswith("|"):
            rows = [r for r in block if r.strip()]
            kept = rows[:2] + rows[2 : 2 + TABLE_ROWS]
            trimmed = []
            for r in kept:
                if set(r.replace("|", "").strip()) <= set("-: "):
                    trimmed.append(r)
                else:
                    cells = r.strip().strip("|").split("|")
                    trimmed.append("| " + " | ".join(shorten(c.strip(), CELL_WORDS) for c in cells) + " |")
            if len(rows) > len(kept):
                trimmed.append("| " + " | ".join(["…"] * (kept[0].count("|") - 1)) + " |")
            out.append("\n".join(trimmed))
        elif LIST_ITEM.match(block[0]):
            out.append("\n".join(marker + first_sentence(text, ITEM_WORDS) for marker, text in _list_items(block)))
        else:
            out.append(first_sentence(" ".join(line.strip() for line in block), SENTENCE_WORDS))
    return "\n\n".join(out)


def is_long(source: str) -> bool:
    return len(source.split()) > LONG_WORDS or len(source.splitlines()) > LONG_LINES


def height(cell) -> float:
    """About how many lines of a slide the cell takes (a slide holds SLIDE_LINES)."""
    if cell.cell_type == "markdown":
        lines = 0.0
        for block in _blocks(cell.source):
            if block[0].lstrip().startswith("#"):
                lines += 2
            elif block[0].lstrip().startswith("|"):  # a row wraps with its longest cell
                lines += sum(0.3 + max(len(c) for c in row.split("|")) / 28 * 0.8 for row in block)
            else:
                lines += 0.6 + sum(1 + len(line) // 65 for line in block)
        return lines
    outputs = cell.get("outputs", [])
    figure = any("image/png" in o.get("data", {}) for o in outputs)
    text = sum(
        len(o.get("text", "").splitlines()) + len(o.get("data", {}).get("text/plain", "").splitlines())
        for o in outputs
        if "image/png" not in o.get("data", {})
    )
    return 1 + 0.75 * min(len(cell.source.splitlines()), 11) + (9 if figure else 0.75 * min(text, 11))


SLIDE_LINES = 15


def _fit(source: str) -> str:
    """The first blocks of a condensed cell that fit one slide (the notes hold everything)."""
    kept = []
    for block in _blocks(source):
        trial = "\n\n".join(kept + ["\n".join(block)])
        if kept and height(nbformat.v4.new_markdown_cell(trial)) > SLIDE_LINES:
            break
        kept.append("\n".join(block))
    return "\n\n".join(kept)


def slide_view(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of the lecture for its deck: long markdown cells condensed, each followed by notes;
    a cell that would overfill the slide it is added to starts a slide of its own."""
    view = copy.deepcopy(nb)
    cells, used = [], 0.0
    for cell in view.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind in ("skip", "notes"):
            cells.append(cell)
            continue
        notes = None
        if cell.cell_type == "markdown" and is_long(cell.source):
            notes = nbformat.v4.new_markdown_cell(cell.source, metadata={"slideshow": {"slide_type": "notes"}})
            if "id" in cell:  # the same deck from the same notebook, every time
                notes.id = f"{cell.id}-notes"[-64:]
            cell.source = _fit(condense(cell.source))
        if kind in ("fragment", "-") and used + height(cell) > SLIDE_LINES:
            cell.metadata["slideshow"] = {"slide_type": "subslide"}
            kind = "subslide"
        used = height(cell) + (used if kind in ("fragment", "-") else 0)
        cells += [cell] if notes is None else [cell, notes]
    view.cells = cells
    return view
