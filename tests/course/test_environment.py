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


def test_jupyterlab_shows_no_grading_menus_in_the_course_venv():
    """``make test`` installs the instructor group (nbgrader) into the venv ``make lab`` starts: its
    JupyterLab menus, the notebook package's "open in" buttons and nbgrader's server extensions are
    off there, so that a student's JupyterLab is the same after ``make test`` (the Makefile)."""
    import sys

    from jupyter_server.config_manager import BaseJSONConfigManager
    from jupyterlab_server.config import get_static_page_config

    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("not the course's .venv (made by make): nothing of ours to check")
    disabled = get_static_page_config(level="sys_prefix").get("disabledExtensions", {})
    assert disabled.get("@jupyter/nbgrader") is True and disabled.get("@jupyter-notebook/lab-extension") is True
    config = BaseJSONConfigManager(config_dir=str(Path(sys.prefix) / "etc" / "jupyter")).get("jupyter_server_config")
    extensions = config.get("ServerApp", {}).get("jpserver_extensions", {})
    nbgrader = {name: on for name, on in extensions.items() if name.startswith("nbgrader")}
    assert nbgrader and not any(nbgrader.values()), nbgrader


def test_the_instructor_group_stays_out_of_the_students_installs():
    """nbgrader is in pyproject's optional group (make test installs it), not in the dependencies
    make lab and environment.yml install."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    instructor = [normalise(d) for d in data["project"]["optional-dependencies"]["instructor"]]
    assert "nbgrader==0.9.6" in instructor
    students = set(map(normalise, pyproject_deps())) | set(map(normalise, environment_pip_deps()))
    assert not students & set(instructor)
