"""Each script the notebooks write is exported, unchanged, to scripts/."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parent.parent


def test_scripts_equal_their_last_writefile_cell():
    result = subprocess.run(
        [sys.executable, "tools/export_scripts.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_exported_hello_world_runs_under_torchrun():
    """The exported copy is what a user runs on a cluster: it must work as it is."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    result = run_bounded(
        [torchrun, "--standalone", "--nproc_per_node=2", "scripts/hello_allreduce.py"], timeout=60, cwd=ROOT
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


# One way to join the process group. Chapters 00, 03 and 04 teach it (inline, torchrun only, then
# with mp.spawn), train_ddp.py grows its own (a group of one in memory, a store per restart), and
# chapters 09-10 show the store and the node by hand; every other script that joins a group
# carries the canonical `free_port()` + `setup()` of c05_ddp_internals.py, verbatim (scripts/README.md).
OWN_SETUP = {
    "hello_allreduce.py": "00: the first script, inline and commented",
    "c03_torchrun_environment.py": "03 teaches the block, under torchrun only",
    "c03_send_recv.py": "03",
    "c03_collectives.py": "03",
    "c03_ring_allreduce.py": "03",
    "c03_spawn_worker.py": "03: mp.spawn meets through tcp://",
    "c04_each_rank_holds.py": "04: two emulated nodes, the environment by hand",
    "c04_mp_spawn.py": "04: mp.spawn sets the environment itself",
    "train_ddp.py": "04, 09: a group of one in memory, a store per restart",
    "c09_failures.py": "09: stores by hand (the stale-store demo)",
    "c10_multi_node_ranks.py": "10: requires torchrun's node variables",
}


def _functions(path):
    source = path.read_text()
    return {
        node.name: ast.get_source_segment(source, node)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef)
    }


def test_every_script_joins_the_group_with_the_one_setup_block():
    canonical = _functions(ROOT / "scripts" / "c05_ddp_internals.py")
    canonical = {name: canonical[name] for name in ("free_port", "setup")}
    users = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        text = path.read_text()
        if found := re.search(r"^from (c\d\d_\w+) import .*\bsetup\b", text, re.M):
            # A chapter's later scripts may import the block from its first one, beside them (05, 08).
            source = found.group(1) + ".py"
            assert source[:3] == path.name[:3], f"scripts/{path.name} imports setup() from another chapter's {source}"
            assert _functions(ROOT / "scripts" / source).get("setup") == canonical["setup"], source
            assert "init_process_group" not in text, f"scripts/{path.name}: imports setup(), joins by hand"
            users.append(path.name)
            continue
        if "init_process_group" not in text or path.name in OWN_SETUP:
            continue
        users.append(path.name)
        functions = _functions(path)
        for name, body in canonical.items():
            assert functions.get(name) == body, (
                f"scripts/{path.name}: {name}() differs from the canonical block in c05_ddp_internals.py "
                f"(copy it verbatim, or list the script in OWN_SETUP with the reason)"
            )
    assert len(users) >= 8, users  # the rule covers the chapter scripts, not a handful
    assert set(OWN_SETUP) <= {p.name for p in (ROOT / "scripts").glob("*.py")}
