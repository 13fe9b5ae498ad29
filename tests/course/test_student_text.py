"""What students read stands alone: every mistake label resolves, nothing names author-only files.

- ``M1``…``M24`` in notebooks, labs, scripts and READMEs are entries of ``MISTAKES.md``, and every
  entry links to a heading that exists in the notebook that demonstrates it.
- No student-facing file names the documents the course was written from ("seed 003") or the
  authors' design notes, which students do not have.
"""

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
MISTAKES = ROOT / "MISTAKES.md"
ENTRY = re.compile(r"^### (M\d+)\b(.*)$", re.M)
LINK = re.compile(r"\]\((notebooks/[\w.-]+\.ipynb)#([^)\s]+)\)")
LABEL = re.compile(r"(?<![\w/#-])M(\d{1,3})(?![\w.-])")


def student_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "notebooks", "labs", "solutions", "scripts", "src", "README.md", "MISTAKES.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not tracked:  # not a git checkout (an unpacked archive): read the folders instead
        tracked = [
            str(p.relative_to(ROOT))
            for d in ("notebooks", "labs", "solutions", "scripts", "src")
            for p in (ROOT / d).rglob("*")
            if p.is_file()
        ] + ["README.md", "MISTAKES.md"]
    return [ROOT / f for f in tracked if (ROOT / f).suffix in {".ipynb", ".md", ".py", ".sbatch", ".yaml"}]


def text_of(path: Path) -> str:
    """What a student reads in a file: for notebooks, the cells' sources (not the outputs)."""
    if path.suffix == ".ipynb":
        return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    return path.read_text(encoding="utf-8")


def heading_anchor(line: str) -> str:
    """The id JupyterLab gives a Markdown heading: its rendered text with spaces as hyphens."""
    text = line.lstrip("#").strip()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.replace("`", "").replace("**", "").replace("__", "")
    return text.replace(" ", "-")


def headings(notebook: Path) -> set[str]:
    found = set()
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "markdown":
            found |= {heading_anchor(line) for line in cell.source.splitlines() if re.match(r"#{1,6} ", line)}
    return found


def entries() -> dict[str, str]:
    """Label -> the text of its entry in MISTAKES.md."""
    text = MISTAKES.read_text(encoding="utf-8")
    starts = list(ENTRY.finditer(text))
    return {
        m.group(1): text[m.start() : starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        for i, m in enumerate(starts)
    }


def test_every_entry_links_to_an_existing_heading():
    found = entries()
    assert len(found) >= 22
    for label, body in found.items():
        links = LINK.findall(body)
        assert links, f"{label} links to no notebook cell"
        for notebook, anchor in links:
            assert (ROOT / notebook).exists(), f"{label}: {notebook} does not exist"
            assert unquote(anchor) in headings(ROOT / notebook), (
                f"{label}: {notebook} has no heading with anchor {unquote(anchor)!r}"
            )


def test_every_label_used_resolves_to_an_entry():
    known = set(entries())
    unresolved = {}
    for path in student_files():
        labels = {f"M{n}" for n in LABEL.findall(text_of(path))}
        if missing := labels - known:
            unresolved[str(path.relative_to(ROOT))] = sorted(missing)
    assert not unresolved, f"labels with no entry in MISTAKES.md: {unresolved}"


def test_links_to_the_list_of_mistakes_land_on_an_entry():
    known = {label.lower() for label in entries()}
    broken = []
    for path in student_files():
        for target, anchor in re.findall(r"\]\(([^)\s]*MISTAKES\.md)#([^)\s]+)\)", text_of(path)):
            if not (path.parent / target).resolve() == MISTAKES.resolve() or anchor not in known:
                broken.append(f"{path.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, f"links that land nowhere: {broken}"


@pytest.mark.parametrize("pattern", [r"\bseeds? 00\d", r"COURSE\.md", r"FIELD-NOTES", r"MISCONCEPTIONS\.md"])
def test_no_author_only_references(pattern):
    hits = [str(p.relative_to(ROOT)) for p in student_files() if re.search(pattern, text_of(p), re.I)]
    assert not hits, f"{pattern!r} names something students do not have, in: {hits}"


def test_the_checks_catch_what_they_look_for():
    assert heading_anchor("### Bytes per rank: ring vs `torch` (M13)") == "Bytes-per-rank:-ring-vs-torch-(M13)"
    assert [f"M{n}" for n in LABEL.findall("see M5 and (M12), not #M3 or M2.1 or NM4")] == ["M5", "M12"]
