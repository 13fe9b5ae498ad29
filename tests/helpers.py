"""What several test files share: the course's notebooks, in order."""

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
