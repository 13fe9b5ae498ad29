"""A student's view: JupyterLab in a real browser runs the course's notebooks.

JupyterLab starts from the course environment on 127.0.0.1 (a port the server takes itself) with
a token and isolated Jupyter config/data/runtime/settings folders, on a copy of chapter 00 (so
nothing in the checkout changes), its stored outputs cleared, with every other lecture's explorer
cell appended. Headless Chromium opens it, waits for the kernel, runs all cells and waits until
every cell has run (its prompt shows a number: the kernel's status alone reads "Idle" for a moment
between two cells). Then:

- chapter 00's printed output and its `!torchrun` cell's output appear, and moving the placement
  slider with the keyboard changes the kernel-computed placement;
- every other explorer of the course (01, 03, 07, 08, 11, 14a), taken verbatim from its lecture:
  moving one control changes what the kernel computes and shows (text or figure), not just the
  slider.

One server, one kernel, one browser for all of it. Waits are conditions with generous deadlines,
so a loaded machine makes the test slower, never red. Screenshots go to build/test-artifacts/.
"""

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from browser import ARTIFACTS, ROOT, chromium_or_skip, is_local, launch
from parallel_course.launch import _kill_group

NOTEBOOK = "00_setup_check.ipynb"
# Each explorer: the lecture it lives in, the call that builds it, the control the test moves.
EXPLORER_CELLS = [
    ("00_setup_check.ipynb", "placement_explorer(", "processes"),
    ("01_why_parallel.ipynb", "cost_model_explorer(", "workers N"),
    ("03_processes_and_collectives.ipynb", "ring_allreduce_explorer(", "ranks N"),
    ("07a_pipeline_parallelism.ipynb", "pipeline_explorer(", "micro-batches m"),
    ("08_sharding_zero_fsdp.ipynb", "zero_calculator(", "ranks N"),
    ("11_capstone_gpt.ipynb", "layout_memory_explorer(", "sequence length"),
    ("14a_planning_a_run.ipynb", "planner_explorer(", "tensor parallel tp"),
]
EXPLORER_IMPORTS = """\
import torch

from parallel_course.explorers import (
    cost_model_explorer,
    layout_memory_explorer,
    pipeline_explorer,
    placement_explorer,
    planner_explorer,
    ring_allreduce_explorer,
    zero_calculator,
)
"""
# Long enough for a busy two-core machine; a healthy run takes a fraction of it.
SLOW = 180_000  # ms


def explorer_cell(lecture: str, call: str) -> str:
    source = [
        c.source
        for c in nbformat.read(ROOT / "notebooks" / lecture, as_version=4).cells
        if c.cell_type == "code" and call in c.source
    ]
    assert len(source) == 1, f"{lecture}: expected one cell calling {call}, found {len(source)}"
    return source[0]


def served_notebook() -> tuple[nbformat.NotebookNode, list[int]]:
    """Chapter 00 with its outputs cleared (what the test sees, the run made), then every other
    lecture's explorer cell, verbatim, after the imports they need; and the index among the code
    cells of each explorer of EXPLORER_CELLS."""
    nb = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(EXPLORER_IMPORTS))
    for lecture, call, _ in EXPLORER_CELLS:
        if lecture != NOTEBOOK:
            nb.cells.append(nbformat.v4.new_code_cell(explorer_cell(lecture, call)))
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        cell.outputs, cell.execution_count = [], None
    where = [next(i for i, c in enumerate(code) if call in c.source) for _, call, _ in EXPLORER_CELLS]
    return nb, where


def server_port(runtime: Path, server: subprocess.Popen, log: Path) -> int:
    """The port the server took (it was told 0: the system hands out a free one at its bind, where
    a port chosen here and bound by the server seconds later could be taken in between), from the
    file the server writes once it listens."""
    deadline = time.monotonic() + 60
    while True:
        for info in runtime.glob("jpserver-*.json"):
            try:
                return json.loads(info.read_text())["port"]
            except (ValueError, KeyError):
                # Being written: read again.
                pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(0.2)


@pytest.fixture
def jupyterlab(tmp_path):
    """(base URL, token, index among the code cells of each explorer of EXPLORER_CELLS) of a
    JupyterLab stopped by PID at the end."""
    chromium_or_skip()
    served = tmp_path / "course"
    served.mkdir()
    notebook, where = served_notebook()
    nbformat.write(notebook, served / NOTEBOOK)
    jupyter = {name: tmp_path / name for name in ("config", "data", "settings")}
    # Short: the kernel's sockets (Unix sockets, no TCP port to lose: tests/harness/unix_socket_kernels.py)
    # sit beside its connection file, and a socket's path may not exceed about 100 bytes.
    jupyter["runtime"] = Path(tempfile.mkdtemp(prefix="jupyterlab-"))
    for d in jupyter.values():
        d.mkdir(exist_ok=True)
    # Render every cell, also those scrolled out of view, so the test can see every prompt.
    tracker = jupyter["settings"] / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    # No "news" toast over the notebook in a fresh profile.
    (jupyter["config"] / "labconfig").mkdir()
    (jupyter["config"] / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(jupyter["config"]),
        JUPYTER_DATA_DIR=str(jupyter["data"]),
        JUPYTER_RUNTIME_DIR=str(jupyter["runtime"]),
        JUPYTERLAB_SETTINGS_DIR=str(jupyter["settings"]),
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
    )
    token = secrets.token_hex(16)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={served}",
        "--KernelManager.transport=ipc",
        "--KernelManager.transport_encryption=auto",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{server_port(jupyter['runtime'], server, tmp_path / 'jupyterlab.log')}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "jupyterlab.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        # An unauthenticated request must be refused: never an open server.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/contents", timeout=5)
        assert refused.value.code == 403
        yield base, token, where
    finally:
        _kill_group(server.pid)  # the server, its kernels and their workers
        server.wait(timeout=30)
        log.close()
        shutil.rmtree(jupyter["runtime"], ignore_errors=True)


def open_and_run_all(page, base: str, token: str, name: str):
    """Open a notebook, run all cells, and return its panel once every code cell has run."""
    from playwright.sync_api import expect

    page.goto(f"{base}/lab/tree/{name}?token={token}")
    # Kernel connected and idle before "Run All", or a kernel dialog appears or nothing runs.
    expect(page.get_by_text("| Idle").first).to_be_visible(timeout=SLOW)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    code_cells = notebook.locator(".jp-CodeCell")
    expect(code_cells.first).to_be_visible(timeout=SLOW)
    ran = notebook.locator(".jp-CodeCell .jp-InputPrompt").filter(has_text=re.compile(r"\[\d+\]"))
    expect(ran).to_have_count(code_cells.count(), timeout=SLOW)
    expect(page.get_by_text("| Idle").first).to_be_visible(timeout=SLOW)
    return notebook


def computed_view(output):
    """What the kernel computed in an explorer's output: its HTML texts and its images."""
    texts = output.locator(".widget-html-content").all_inner_texts()
    # An `interactive` shows its function's result in an output area nested in the widget.
    texts += output.locator(".widget-output .jp-OutputArea-output").all_inner_texts()
    images = [img.get_attribute("src") for img in output.locator("img").all()]
    return texts, images


def move_slider(page, output, label: str) -> None:
    """Move the slider named ``label`` one step with the keyboard, as a student would."""
    from playwright.sync_api import expect

    handle = output.locator(".widget-hslider", has_text=label).locator(".noUi-handle").first
    expect(handle).to_be_visible(timeout=SLOW)
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.keyboard.press("ArrowLeft")


def test_a_student_runs_a_notebook_and_every_explorer_in_jupyterlab(jupyterlab):
    from playwright.sync_api import expect, sync_playwright

    base, token, where = jupyterlab
    outside = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: None if is_local(r.url) else outside.append(r.url))
        notebook = open_and_run_all(page, base, token, NOTEBOOK)

        # The students' JupyterLab: no instructor menu, even after make test installed nbgrader.
        expect(page.get_by_role("menuitem", name="Nbgrader")).to_have_count(0)
        # Printed output, and the output of a `!torchrun` cell, from this run (none was stored).
        expect(notebook.locator(".jp-OutputArea-output").first).to_be_visible()
        expect(notebook.get_by_text("OK: every rank holds the sum").first).to_be_visible()

        code_cells = notebook.locator(".jp-CodeCell")
        # Chapter 00's placement slider: 2 -> 3 processes, and the kernel recomputes the placement.
        view = code_cells.nth(where[0]).locator(".jp-OutputArea-output").first
        slider = view.locator(".widget-hslider", has_text="processes").locator(".noUi-handle").first
        expect(view).to_contain_text("rank 1: cpu")
        expect(view).not_to_contain_text("rank 2:")
        slider.scroll_into_view_if_needed()
        slider.focus()
        page.keyboard.press("ArrowRight")
        expect(view).to_contain_text("rank 2: ", timeout=SLOW)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab_widget.png"))

        # Every other lecture's explorer: one control moved, what the kernel shows changes.
        for (lecture, _call, label), index in list(zip(EXPLORER_CELLS, where))[1:]:
            output = code_cells.nth(index).locator(".jp-OutputArea-output").first
            expect(output.locator(".noUi-handle").first).to_be_visible(timeout=SLOW)
            before = computed_view(output)
            output.scroll_into_view_if_needed()
            assert any(before[0]) or before[1], f"{lecture}: the explorer shows nothing computed"
            move_slider(page, output, label)
            deadline = time.monotonic() + SLOW / 1000
            while computed_view(output) == before:  # the kernel's answer arrives
                assert time.monotonic() < deadline, f"{lecture}: moving {label!r} changed nothing"
                page.wait_for_timeout(250)
            page.screenshot(path=str(ARTIFACTS / f"explorer_{lecture[:2]}.png"))
        browser.close()
    assert not outside, f"JupyterLab made requests that leave the machine: {outside}"
