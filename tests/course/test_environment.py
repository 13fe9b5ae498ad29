"""One dependency list: environment.yml's pip section must equal pyproject's dependencies."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def normalise(req: str) -> str:
    name, rest = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req).groups()
    return re.sub(r"[-_.]+", "-", name).lower() + rest.replace(" ", "")


def pyproject_deps() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["project"]["dependencies"]


def environment_pip_deps() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip) == 1, "environment.yml needs exactly one pip: section"
    return [d for d in pip[0] if not d.startswith("-e")]


def test_environment_yml_installs_the_pyproject_dependencies():
    assert sorted(map(normalise, environment_pip_deps())) == sorted(map(normalise, pyproject_deps()))


def test_environment_yml_installs_the_course_package():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip


def test_every_dependency_says_where_it_is_used():
    for path in ("pyproject.toml", "environment.yml"):
        for line in (ROOT / path).read_text().splitlines():
            if re.search(r"==\d", line):
                assert "#" in line, f"{path}: no comment on where it is used: {line.strip()}"


def test_torch_is_pinned_to_the_version_of_the_stored_outputs():
    assert "torch==2.13.0" in pyproject_deps()


def test_jupyterlab_opens_without_a_news_toast_in_the_course_venv():
    """``make`` turns JupyterLab's announcements off in the course's environment (not in $HOME),
    so a fresh profile opens the first notebook with nothing in the way."""
    import json
    import sys

    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("not the course's .venv (made by make): nothing of ours to check")
    config = Path(sys.prefix) / "etc" / "jupyter" / "labconfig" / "page_config.json"
    assert config.exists(), f"{config} is missing: run make again"
    disabled = json.loads(config.read_text()).get("disabledExtensions", {})
    assert disabled.get("@jupyterlab/apputils-extension:announcements") is True
