"""Each script the notebooks write is exported, unchanged, to scripts/."""

import ast
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]


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
    from parallel_course.scriptdiff import written_scripts

    chapters = defaultdict(set)  # script -> the chapters whose notebooks write it
    for notebook in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        for name in written_scripts(notebook):
            chapters[name].add(notebook.name.split("_")[0])
    canonical = _functions(ROOT / "scripts" / "c05_ddp_internals.py")
    canonical = {name: canonical[name] for name in ("free_port", "setup")}
    users = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        text = path.read_text()
        if found := re.search(r"^from (c\d\d_\w+|train_\w+) import .*\bsetup\b", text, re.M):
            # A chapter's later scripts may import the block from its first one, beside them (03, 05, 08,
            # 11): the canonical one, or the one chapter 03 teaches.
            source = found.group(1) + ".py"
            assert chapters[source] & chapters[path.name], (
                f"scripts/{path.name} imports setup() from another chapter's {source}"
            )
            assert source in OWN_SETUP or _functions(ROOT / "scripts" / source).get("setup") == canonical["setup"], (
                source
            )
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


# Where a script may leave its group other than in its __main__ block, and why.
LEAVES_ELSEWHERE = {
    "c03_spawn_worker.py": "03: an mp.spawn worker function; its process ends when it returns",
    "c04_mp_spawn.py": "04: an mp.spawn worker around train_ddp.main()",
    "c04_each_rank_holds.py": "04: a script without functions",
    "bench_scaling.py": "06b: leaves its group before it launches its comparison runs",
}


def course_scripts():
    """Every script a student runs: scripts/ and the lab scripts the solutions write."""
    from parallel_course.scriptdiff import written_scripts

    found = {path.name: path.read_text() for path in sorted((ROOT / "scripts").glob("*.py"))}
    for notebook in sorted((ROOT / "solutions").glob("*.ipynb")):
        found.update({name: versions[-1] for name, versions in written_scripts(notebook).items()})
    return found


def test_every_script_leaves_its_group_after_freeing_what_holds_it():
    """A gloo group still alive at interpreter exit aborts a finished job now and then: a worker
    thread frees the last collective's tensors while Python shuts down ("terminate called without
    an active exception"). DDP, FSDP and tensors of collectives keep a group alive past
    destroy_process_group(), so a script leaves it once main() has returned, right after
    gc.collect(); main() returns its exit code instead of calling sys.exit (which would skip both)."""
    checked = []
    for name, text in course_scripts().items():
        if "destroy_process_group" not in text and "init_process_group" not in text and "setup()" not in text:
            continue
        tree = ast.parse(text)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        destroys = [c for c in calls if ast.unparse(c.func).endswith("destroy_process_group")]
        assert destroys, f"{name}: joins a process group but never leaves it"
        for call in destroys:
            statement = parents[call]
            block = next(
                getattr(parents[statement], field)
                for field in ("body", "orelse", "finalbody")
                if statement in getattr(parents[statement], field, [])
            )
            before = block[block.index(statement) - 1] if block.index(statement) else None
            assert before is not None and ast.unparse(before) == "gc.collect()", (
                f"{name}: destroy_process_group() without gc.collect() just before it"
            )
            ancestors, node = [], statement
            while node in parents:
                node = parents[node]
                ancestors.append(node)
            in_main_block = any(isinstance(a, ast.If) and "__main__" in ast.unparse(a.test) for a in ancestors)
            assert in_main_block or name in LEAVES_ELSEWHERE, (
                f"{name}: leaves its group inside a function, while what main() built may still hold it "
                f"(leave it in the __main__ block, or list the script in LEAVES_ELSEWHERE with the reason)"
            )
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
                if ast.unparse(call.func) == "sys.exit" and call.args:
                    assert isinstance(call.args[0], ast.Constant | ast.JoinedStr), (
                        f"{name}: {function.name}() exits with a code, skipping the __main__ block's "
                        f"teardown: return the code instead"
                    )
        checked.append(name)
    assert len(checked) >= 25, checked
    assert set(LEAVES_ELSEWHERE) <= set(checked)
