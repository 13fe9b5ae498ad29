"""What several test files share: the course's notebooks in order, and scripts loaded as modules."""

import importlib.util
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
