"""Each script the notebooks write is exported, unchanged, to scripts/."""

import shutil
import subprocess
import sys
from pathlib import Path

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parent.parent


def test_scripts_equal_their_last_writefile_cell():
    result = subprocess.run(
        [sys.executable, "tools/export_scripts.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_exported_hello_world_runs_under_torchrun():
    """The exported copy is what a user runs on a cluster: it must work as it is."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    result = run_bounded(
        [torchrun, "--standalone", "--nproc_per_node=2", "scripts/hello_allreduce.py"],
        timeout=60, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK: every rank holds the sum" in result.stdout


def test_every_script_is_described_in_the_folder_readme():
    readme = (ROOT / "scripts" / "README.md").read_text()
    for path in sorted((ROOT / "scripts").glob("*.py")):
        assert f"`{path.name}`" in readme, f"scripts/README.md does not describe {path.name}"


def test_every_tool_is_described_in_its_readme_and_none_is_left_in_scripts():
    readme = (ROOT / "tools" / "README.md").read_text()
    for path in sorted((ROOT / "tools").glob("*.py")):
        assert f"`{path.name}`" in readme, f"tools/README.md does not describe {path.name}"
        assert not (ROOT / "scripts" / path.name).exists(), f"{path.name} is an authoring tool: tools/ only"
