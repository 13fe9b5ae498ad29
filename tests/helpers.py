"""What several test files share: the course's notebooks in order, and scripts loaded as modules."""

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# 00_setup_check.ipynb ... 06a_timing_and_bandwidth.ipynb ...: a chapter number, a letter where a
# chapter has several lectures, then the name.
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def chapter(notebook: Path) -> str:
    """'06a' for 06a_timing_and_bandwidth.ipynb."""
    return notebook.name.split("_")[0]


def load_script(path: Path | str):
    """A script of scripts/ (or any path) imported as a module, without running its main(); it finds
    the scripts beside it, as under `python script.py`."""
    path = ROOT / "scripts" / path if isinstance(path, str) else path
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def sanitize(text: str) -> str:
    """``text`` with tests/sanitize.cfg applied, as strict nbval applies it to stored and fresh outputs."""
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns((ROOT / "tests" / "sanitize.cfg").read_text()):
        text = re.sub(regex, replace, text)
    return text


NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def report_differences(stored: str, fresh: str, rtol: float = 1e-3) -> list[str]:
    """Where two runs' outputs disagree once sanitized, word for word, except that numbers may differ
    by ``rtol`` relative: the float rounding of other hardware (a GPU against the CPU that stored the
    output). One entry per line that differs; an empty list when they agree."""
    stored_lines, fresh_lines = sanitize(stored).splitlines(), sanitize(fresh).splitlines()
    problems = []
    if len(stored_lines) != len(fresh_lines):
        problems.append(f"{len(fresh_lines)} lines where the stored output has {len(stored_lines)}")
    for old, new in zip(stored_lines, fresh_lines):
        if NUMBER.sub("#", old) != NUMBER.sub("#", new):
            problems.append(f"expected {old!r}, got {new!r}")
            continue
        for a, b in zip(NUMBER.findall(old), NUMBER.findall(new)):
            if abs(float(a) - float(b)) > rtol * max(abs(float(a)), abs(float(b))):
                problems.append(f"{a} became {b} in {new!r}")
                break
    return problems
