"""Stored outputs show what a student can compare with their own run, never the author's machine.

Absolute paths (a home folder, a checkout under /work, /tmp, a user name in a path) would tell a
student nothing and leak where the outputs were made; relative paths (``work/...``,
``../scripts/...``) are fine. Tracebacks are read too: IPython colours them with ANSI escape codes,
which are taken out first (``\x1b[32m/work/...`` would otherwise hide the path behind the ``m``).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import LECTURES, SOLUTIONS

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = [*LECTURES, *SOLUTIONS]
# An absolute path into a home folder, a root account, a CI workspace or a temporary folder.
ABSOLUTE = re.compile(r"(?<![\w.])/(home|root|Users|work|tmp|private|var/folders|opt|mnt)/[\w.-]+")
# The colour and cursor codes of a terminal (and of IPython's tracebacks): ESC [ ... letter.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def output_texts(nb) -> list[str]:
    """Every text a cell's outputs show: streams, text data, and an error's name, value and
    traceback, without the terminal's colour codes."""
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                texts.append(out["text"])
            for key, value in out.get("data", {}).items():
                if key.startswith("text/") and isinstance(value, str):
                    texts.append(value)
            texts.extend(str(out[key]) for key in ("ename", "evalue") if key in out)
            texts.extend(out.get("traceback", []))
    return [ANSI_ESCAPE.sub("", text) for text in texts]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_no_absolute_paths_in_stored_outputs(path):
    found = sorted(
        {m.group(0) for text in output_texts(nbformat.read(path, as_version=4)) for m in ABSOLUTE.finditer(text)}
    )
    assert not found, f"{path.name} stores absolute paths in its outputs: {found[:5]}"


def test_the_scan_finds_what_it_looks_for():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(sys.executable)")
    cell.outputs = [nbformat.v4.new_output("stream", text="python 3.11 (/home/alice/course/.venv/bin/python)\n")]
    nb.cells.append(cell)
    assert any(ABSOLUTE.search(t) for t in output_texts(nb))
    assert not ABSOLUTE.search("wrote work/c04/final.pt and ../scripts/train_ddp.py")


def test_the_scan_reads_coloured_tracebacks():
    """An error output as IPython stores it: each line of the traceback coloured, the path of the
    file that raised right after an escape code (the raw text hides it from ABSOLUTE)."""
    line = "\x1b[36mFile \x1b[39m\x1b[32m/work/main/.venv/lib/python3.11/site-packages/torch/spawn.py:200\x1b[39m"
    assert not ABSOLUTE.search(line)
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("context.join()")
    cell.outputs = [
        nbformat.v4.new_output("error", ename="ProcessExitedException", evalue="exit code 1", traceback=[line])
    ]
    nb.cells.append(cell)
    found = [m.group(0) for t in output_texts(nb) for m in ABSOLUTE.finditer(t)]
    assert found == ["/work/main"]
    # An error's value is read too: a message that names a file.
    cell.outputs = [nbformat.v4.new_output("error", ename="FileNotFoundError", evalue="/home/alice/x.pt", traceback=[])]
    assert [m.group(0) for t in output_texts(nb) for m in ABSOLUTE.finditer(t)] == ["/home/alice"]


def test_outputs_are_stored_from_a_kernel_that_sees_no_gpu(tmp_path):
    """make outputs on a GPU machine must not store GPU outputs, which every CPU check would then fail:
    its kernels (and whatever they launch) run with CUDA_VISIBLE_DEVICES set to nothing."""
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import os\nprint(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))")]
    )
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(notebook, path)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "execute_notebooks.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "storing CPU outputs" in result.stdout
    assert nbformat.read(path, as_version=4).cells[0].outputs[0]["text"] == "''\n"
