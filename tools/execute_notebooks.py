"""Execute notebooks in place and store their outputs (what strict nbval compares against).

    python tools/execute_notebooks.py notebooks/01_why_parallel.ipynb [...]
    python tools/execute_notebooks.py              # every lecture and solution notebook

Runs each notebook in its own folder, as nbval and JupyterLab do, with the same per-cell
timeout as the tests; drops stored widget state and execution timestamps, which only add noise.

The stored outputs are a CPU run's, whatever the machine: CI and every student's check compare
against them on CPUs. On a GPU machine the kernels run with CUDA_VISIBLE_DEVICES set to nothing,
so they see no GPU and take the CPU paths (gloo, bfloat16 autocast, ...), and this says so.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

ROOT = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 60  # same as the test suite (pyproject / tests)


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        # Encrypted kernel transport: no start-up warning from ipykernel lands in a cell.
        config=Config({"KernelManager": {"transport_encryption": "auto"}}),
    )
    client.execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.notebooks or sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        # The kernels and every process they start inherit it: no GPU is visible to any of them.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        print("storing CPU outputs: the kernels run with CUDA_VISIBLE_DEVICES= (no GPU visible)", flush=True)
    for path in paths:
        print(f"{path}: {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
