"""Each script the notebooks write is exported, unchanged, to scripts/."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

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


def test_the_package_index_names_every_module_and_subpackage():
    """The package's docstring (its __init__.py) is its README: one line of purpose per module and
    subpackage (explorers, slips, training)."""
    package = ROOT / "src" / "parallel_course"
    index = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [name for name in names if f"``{name}``" not in index]
    assert not missing, f"src/parallel_course/__init__.py does not describe {missing}"


def test_every_tool_is_described_in_its_readme_and_none_is_left_in_scripts():
    readme = (ROOT / "tools" / "README.md").read_text()
    for path in sorted((ROOT / "tools").glob("*.py")):
        assert f"`{path.name}`" in readme, f"tools/README.md does not describe {path.name}"
        assert not (ROOT / "scripts" / path.name).exists(), f"{path.name} is an authoring tool: tools/ only"


# One way to join the process group: scripts/dist_setup.py, written where chapter 04 teaches it.
# Chapters 00-04 may build the block by hand (that is their lesson); after them nothing defines it
# again: no setup() or free_port() of its own in a script, a lecture or a lab.
SETUP_MODULE = "dist_setup.py"
SETUP_FUNCTIONS = re.compile(r"^\s*def (setup|free_port|pick_device)\(", re.M)


def chapters_writing(name: str) -> set[str]:
    """The chapters (00, 03, 11b, ...) whose lecture notebooks write script ``name``."""
    from parallel_course.scriptdiff import written_scripts

    return {
        notebook.name.split("_")[0]
        for notebook in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
        if name in written_scripts(notebook)
    }


def taught_by_hand(chapter: str) -> bool:
    """Chapters up to 04 build the setup in front of the reader; 04 writes the module itself."""
    return int(chapter[:2]) <= 4


def test_the_setup_module_is_written_where_chapter_04_teaches_it():
    assert chapters_writing(SETUP_MODULE) == {"04"}


def test_after_chapter_04_nothing_defines_the_setup_again():
    from parallel_course.scriptdiff import written_scripts

    places = {}
    for path in sorted((ROOT / "scripts").glob("*.py")):
        chapters = chapters_writing(path.name)
        if path.name != SETUP_MODULE and not (chapters and all(map(taught_by_hand, chapters))):
            places[f"scripts/{path.name}"] = path.read_text()
    for folder in ("notebooks", "solutions"):
        for notebook in sorted((ROOT / folder).glob("*.ipynb")):
            chapter = re.search(r"(\d\d[a-z]?)_", notebook.name).group(1)
            if taught_by_hand(chapter):
                continue
            cells = nbformat.read(notebook, as_version=4).cells
            places[f"{folder}/{notebook.name}"] = "\n".join(c.source for c in cells if c.cell_type == "code")
            for name, versions in written_scripts(notebook).items():
                places[f"{folder}/{notebook.name}: {name}"] = versions[-1]
    own = [f"{where}: def {m.group(1)}()" for where, text in places.items() for m in SETUP_FUNCTIONS.finditer(text)]
    assert not own, f"defined again (import it from {SETUP_MODULE}):\n" + "\n".join(own)
    joining = [where for where, text in places.items() if "from dist_setup import" in text]
    assert len(joining) >= 15, joining  # the rule covers the course's scripts, not a handful


# Where a script may leave its group other than in its __main__ block, and why.
LEAVES_ELSEWHERE = {
    "c03_spawn_worker.py": "03: an mp.spawn worker function; its process ends when it returns",
    "c04_mp_spawn.py": "04: an mp.spawn worker around c04_train_ddp.main()",
    "c04_each_rank_holds.py": "04: a script without functions",
}


def course_scripts():
    """Every script a student runs: scripts/ and the lab scripts the solutions write."""
    from parallel_course.scriptdiff import written_scripts

    found = {path.name: path.read_text() for path in sorted((ROOT / "scripts").glob("*.py"))}
    for notebook in sorted((ROOT / "solutions").glob("*.ipynb")):
        found.update({name: versions[-1] for name, versions in written_scripts(notebook).items()})
    return found


def in_main_block(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
    return False


def test_every_script_leaves_its_group_after_freeing_what_holds_it():
    """A gloo group still alive at interpreter exit aborts a finished job now and then: a worker
    thread frees the last collective's tensors while Python shuts down ("terminate called without
    an active exception"). DDP, FSDP and tensors of collectives keep a group alive past
    destroy_process_group(), so a script leaves it once main() has returned, right after
    gc.collect() (dist_setup.teardown() does both); main() returns its exit code instead of calling
    sys.exit (which would skip the __main__ block's teardown)."""
    checked = []
    for name, text in course_scripts().items():
        if not re.search(r"init_process_group|destroy_process_group|setup\(\)|teardown\(\)", text):
            continue
        tree = ast.parse(text)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        teardowns = [c for c in calls if ast.unparse(c.func) == "teardown"]
        destroys = [c for c in calls if ast.unparse(c.func).endswith("destroy_process_group")]
        assert teardowns or destroys, f"{name}: joins a process group but never leaves it"
        for call in destroys:
            statement = parents[call]
            block = next(
                getattr(parents[statement], field)
                for field in ("body", "orelse", "finalbody")
                if statement in getattr(parents[statement], field, [])
            )
            before = block[block.index(statement) - 1] if block.index(statement) else None
            assert before is not None and ast.unparse(before) == "gc.collect()", (
                f"{name}: destroy_process_group() without gc.collect() just before it (or call teardown())"
            )
        # The one place that leaves a group for the scripts beside it: a teardown() function.
        inside_teardown = {
            call
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef) and function.name == "teardown"
            for call in ast.walk(function)
        }
        for call in teardowns + [c for c in destroys if c not in inside_teardown]:
            assert in_main_block(call, parents) or name in LEAVES_ELSEWHERE, (
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
