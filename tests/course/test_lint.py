"""The whole course passes ruff with the config in pyproject.toml, notebooks included, and the
package, the tests, the tools and scripts/ are laid out as ruff format lays them out.

ruff lints the notebooks' code cells; it skips `%%writefile` cells, but the last one of each name
is exported to scripts/ (tools/export_scripts.py), which it lints. labs/ is excluded: generated
from solutions/, the stubs leave names for the student to define.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Cheap checks of the whole checkout: handed out first, so that a lint error shows in seconds.
pytestmark = pytest.mark.first

ROOT = Path(__file__).resolve().parents[2]


def _ruff():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip(f"ruff is not installed beside {sys.executable}: run make (pyproject.toml lists it)")
    return ruff


def test_ruff_finds_nothing():
    ruff = _ruff()
    version = subprocess.run([ruff, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    result = subprocess.run(
        [ruff, "check", "--no-cache", "--config", "pyproject.toml", "--output-format", "full", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"{version} found problems (fix the code; for a notebook's %%writefile cell, fix the cell, then "
        f"make scripts):\n{result.stdout}{result.stderr}"
    )


def test_code_is_formatted():
    # pyproject.toml says which folders the formatter leaves alone, and why.
    result = subprocess.run(
        [_ruff(), "format", "--check", "--no-cache", "--config", "pyproject.toml", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"run: ruff format .\n{result.stdout}{result.stderr}"
