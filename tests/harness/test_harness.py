"""The test harness itself: strict nbval catches a crashed launch; make refuses an old Python; how
make test's two workers split and order the work (units_of_work.py); the time report (timing.py)."""

import itertools
import os
import shutil
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from harness.units_of_work import UnitsOfWork, in_unit_of
from helpers import HARNESS_PATH, own_suite
from parallel_course.launch import run_bounded
from parallel_course.scriptdiff import written_scripts

ROOT = Path(__file__).resolve().parents[2]


def launch_notebook(folder: Path, name: str, script_body: str) -> None:
    """A one-cell notebook ``name``.ipynb in ``folder`` that runs a script, its stored output a
    successful launch's."""
    script = folder / f"{name}.py"
    script.write_text(script_body)
    cell = new_code_cell(f"!{sys.executable} {script}")
    cell.execution_count = 1
    # `!cmd` output reaches the notebook through a pty, hence \r\n
    cell.outputs = [new_output("stream", name="stdout", text="OK: every rank holds the sum\r\n")]
    nb = new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")


def test_strict_nbval_fails_a_crashed_launch_and_passes_a_good_one(tmp_path):
    """`!cmd` never fails its cell; the stored output is what catches a crash (both notebooks in one
    pytest run of their own, with the suite's nbval options)."""
    launch_notebook(tmp_path, "crashed", "import sys\nsys.exit('worker crashed')\n")
    launch_notebook(tmp_path, "good", "print('OK: every rank holds the sum')\n")
    result = run_bounded(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "harness.unix_socket_kernels",
            "--nbval",
            "--nbval-current-env",
            "--nbval-sanitize-with",
            str(ROOT / "tests/sanitize.cfg"),
            "--nbval-cell-timeout",
            "60",
            "-c",
            "/dev/null",
            "--rootdir",
            str(tmp_path),
            "-rA",
            str(tmp_path / "crashed.ipynb"),
            str(tmp_path / "good.ipynb"),
        ],
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=HARNESS_PATH),
    )
    out = result.stdout
    assert result.returncode == 1, out[-3000:]
    assert "FAILED crashed.ipynb::Cell 0" in out and "worker crashed" in out, out[-3000:]
    assert "PASSED good.ipynb::Cell 0" in out, out[-3000:]


def test_make_refuses_an_old_python_with_a_clear_message(tmp_path):
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.9.18'; fi\nexit 1\n")
    fake.chmod(0o755)
    result = run_bounded([shutil.which("make"), "-s", "-C", str(ROOT), "check-python", f"PYTHON={fake}"], timeout=60)
    assert result.returncode != 0
    assert "needs Python 3.11 or newer" in result.stdout
    assert "Python 3.9.18" in result.stdout


def run_own_suite(folder: Path, plugins: tuple[str, ...], *args: str):
    """pytest in a suite of its own in ``folder``, with some of the harness's plugins."""
    return run_bounded(
        [sys.executable, "-m", "pytest", *own_suite(folder, *plugins), *args],
        timeout=180,
        cwd=folder,
        env=dict(os.environ, PYTHONPATH=HARNESS_PATH),
    )


def writes(*names: str):
    """A notebook that writes each script of ``names`` into work/ (the second of a name in two parts)."""
    cells = []
    for name in names:
        cells += [new_code_cell(f"%%writefile work/{name}\nx = 1"), new_code_cell(f"%%writefile -a work/{name}\ny = 2")]
    return new_notebook(cells=cells)


def test_a_unit_of_work_is_a_test_file_or_a_notebook_with_the_tests_that_ask_for_it():
    units = UnitsOfWork(ROOT)
    lecture = "notebooks/10_multi_node_and_clusters.ipynb"
    assert units.of(f"{lecture}::Cell 4") == units.of(f"{lecture}::Cell 0")
    assert units.of(f"tests/launches/test_after.py::test_reads_what_it_left[{in_unit_of(lecture)}]") == (
        units.of(f"{lecture}::Cell 0")
    )
    assert units.of("tests/launches/test_launch.py::test_x[a::b]") == "tests/launches/test_launch.py"
    assert units.of("tests/launches/test_after.py::test_on_its_own") == "tests/launches/test_after.py"


def test_notebooks_that_write_the_same_name_into_work_are_one_unit(tmp_path):
    """Their scripts would overwrite each other's in work/: one worker runs them one after the other.
    Sharing goes through: a with b (x.py), b with c (y.py) make one unit; another folder has a
    work/ of its own."""
    for path, notebook in {
        "notebooks/a.ipynb": writes("x.py"),
        "notebooks/b.ipynb": writes("y.py", "x.py"),
        "notebooks/c.ipynb": writes("y.py"),
        "notebooks/d.ipynb": writes("z.py"),
        "notebooks/e.ipynb": new_notebook(cells=[new_code_cell("print(1)")]),
        "solutions/f.ipynb": writes("x.py"),
    }.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        nbformat.write(notebook, tmp_path / path)
    units = UnitsOfWork(tmp_path)
    found = {name: units.of(f"{'solutions' if name == 'f' else 'notebooks'}/{name}.ipynb::Cell 1") for name in "abcdef"}
    assert found["a"] == found["b"] == found["c"] == "notebooks/a.ipynb"
    assert found["d"] == "notebooks/d.ipynb" and found["e"] == "notebooks/e.ipynb"
    assert found["f"] == "solutions/f.ipynb"


def test_the_course_notebooks_that_write_a_same_named_script_are_one_unit():
    units = UnitsOfWork(ROOT)
    for folder in ("notebooks", "solutions"):
        notebooks = sorted((ROOT / folder).glob("*.ipynb"))
        names = {notebook: set(written_scripts(notebook)) for notebook in notebooks}
        for a, b in itertools.combinations(notebooks, 2):
            unit_a, unit_b = (units.of(f"{n.relative_to(ROOT).as_posix()}::Cell 0") for n in (a, b))
            if names[a] & names[b]:
                assert unit_a == unit_b, f"{a.name} and {b.name} both write {sorted(names[a] & names[b])}"


RECORD = """\
import os, pathlib


def record(name):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    with open(pathlib.Path(__file__).parent / f"ran_by_{worker}.txt", "a") as log:
        log.write(name + "\\n")
"""


def test_two_workers_run_each_unit_whole_in_order_and_the_time_report_names_every_file(tmp_path):
    """As make test runs: a unit of work goes to one worker, whole, in order; a test that asks for
    another's unit runs there, after it. The time report at the end names every file, slowest last,
    the workers' tests counted by the session."""
    (tmp_path / "test_slow.py").write_text("import time\n\n\ndef test_slow():\n    time.sleep(0.5)\n")
    for name in ("a", "b"):
        tests = "".join(f"\n\ndef test_{name}{i}():\n    record('{name}{i}')\n" for i in range(3))
        (tmp_path / f"test_{name}.py").write_text(RECORD + tests)
    (tmp_path / "test_c.py").write_text(
        RECORD
        + textwrap.dedent(f"""\
        import pytest


        @pytest.mark.parametrize("unit", ["test_a.py"], ids=[{in_unit_of("test_a.py")!r}])
        def test_after_a(unit):
            record("c")
        """)
    )
    plugins = ("harness.units_of_work", "harness.timing")
    result = run_own_suite(tmp_path, plugins, "-n", "2", "--no-loadscope-reorder")
    assert result.returncode == 0, result.stdout[-3000:]
    ran = [log.read_text().split() for log in tmp_path.glob("ran_by_*.txt")]
    assert sorted(name for names in ran for name in names) == ["a0", "a1", "a2", "b0", "b1", "b2", "c"], ran
    # Each unit on one worker, in order, whatever the other worker ran.
    for unit in (["a0", "a1", "a2", "c"], ["b0", "b1", "b2"]):
        assert [[name for name in names if name in unit] for names in ran if unit[0] in names] == [unit], ran
    report = result.stdout.split("time per test file and notebook (slowest last)", 1)[1].splitlines()[1:]
    files = [line.split()[-1] for line in report[:6]]
    assert sorted(files[:4]) == ["test_a.py", "test_b.py", "test_c.py", "test_slow.py"], report
    assert files[3:] == ["test_slow.py", "notebooks", "everything"], report
    assert float(report[3].split()[0]) >= 0.5 and float(report[5].split()[0]) >= 0.5, report


def test_work_is_handed_out_cheap_first_and_heavy_last(tmp_path):
    """The first-marked test, other tests, notebooks, then heavy tests: marked so, or in a heavy folder."""
    test = "def test_it():\n    pass\n"
    files = {
        "tests/launches/test_l.py": test,
        "tests/course/test_marked_heavy.py": f"import pytest\n\npytestmark = pytest.mark.heavy\n\n\n{test}",
        "tests/unit/test_u.py": test,
        "tests/course/test_marked_first.py": f"import pytest\n\npytestmark = pytest.mark.first\n\n\n{test}",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "notebooks").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("1 + 1")]), tmp_path / "notebooks/n.ipynb")
    result = run_own_suite(tmp_path, ("harness.units_of_work",), "--collect-only", "--nbval", *files, "notebooks")
    assert result.returncode == 0, result.stdout[-3000:]
    order = [line.split("::")[0] for line in result.stdout.splitlines() if "::" in line]
    assert order == [
        "tests/course/test_marked_first.py",
        "tests/unit/test_u.py",
        "notebooks/n.ipynb",
        "tests/launches/test_l.py",
        "tests/course/test_marked_heavy.py",
    ], result.stdout


def test_nbval_kernels_talk_over_unix_sockets_where_a_taken_port_kills_a_tcp_kernel(request, tmp_path):
    """unix_socket_kernels.py: nbval's kernels in this run bind files in the run's own folder. The
    negative control is the failure they avoid: a TCP kernel whose port another process took between
    jupyter_client's choice and the kernel's bind dies before it answers."""
    import socket

    import nbval.kernel
    from jupyter_client.manager import KernelManager

    from harness.unix_socket_kernels import FOLDER

    kernel = nbval.kernel.RunningKernel(nbval.kernel.CURRENT_ENV_KERNEL_NAME, cwd=str(tmp_path))
    try:
        folder = Path(request.config.stash[FOLDER])
        assert kernel.km.transport == "ipc" and Path(kernel.km.connection_file).parent == folder
        sockets = sorted(path.name for path in folder.glob(Path(kernel.km.connection_file).stem + "-ipc-*"))
        assert len(sockets) == 5, sockets
    finally:
        kernel.stop()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        manager = KernelManager(
            kernel_name=nbval.kernel.CURRENT_ENV_KERNEL_NAME,
            kernel_spec_manager=nbval.kernel.NbvalKernelspecManager(),
            # The port is ours to choose (no cache of chosen ports): the one a process took.
            cache_ports=False,
            shell_port=taken.getsockname()[1],
        )
        with open(tmp_path / "kernel.err", "w") as stderr:
            manager.start_kernel(cwd=str(tmp_path), stderr=stderr)
        client = manager.client()
        client.start_channels()
        try:
            with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info"):
                client.wait_for_ready(timeout=60)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
        assert "Address already in use" in (tmp_path / "kernel.err").read_text()
    finally:
        taken.close()


class FakeItem:
    def __init__(self, nodeid, *markers):
        self.nodeid, self.markers = nodeid, markers

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_heavy_units_go_out_longest_first_and_an_unmeasured_one_before_them(tmp_path):
    """By the seconds of a time report: the two workers end together; a unit it does not name
    (new since) is taken for the longest. Each unit stays whole and in order; other ranks keep theirs."""
    from harness.units_of_work import handed_out, measured_seconds

    report = """\
================ time per test file and notebook (slowest last) ================
    2.0 s  tests/launches/test_short.py
   50.0 s  notebooks/n.ipynb
  120.0 s  tests/launches/test_long.py
  172.0 s  everything
"""
    seconds = measured_seconds(report)
    assert seconds == {
        "tests/launches/test_short.py": 2.0,
        "notebooks/n.ipynb": 50.0,
        "tests/launches/test_long.py": 120.0,
    }
    items = [
        FakeItem("tests/unit/test_u.py::test_a"),
        FakeItem("notebooks/n.ipynb::Cell 0"),
        FakeItem("tests/launches/test_short.py::test_a", "heavy"),
        FakeItem("tests/launches/test_long.py::test_a", "heavy"),
        FakeItem("tests/launches/test_long.py::test_b", "heavy"),
        FakeItem("tests/launches/test_new.py::test_a", "heavy"),
        FakeItem("tests/course/test_lint.py::test_a", "first"),
    ]
    order = [item.nodeid for item in handed_out(items, UnitsOfWork(tmp_path), seconds)]
    assert order == [
        "tests/course/test_lint.py::test_a",
        "tests/unit/test_u.py::test_a",
        "notebooks/n.ipynb::Cell 0",
        "tests/launches/test_new.py::test_a",
        "tests/launches/test_long.py::test_a",
        "tests/launches/test_long.py::test_b",
        "tests/launches/test_short.py::test_a",
    ]
