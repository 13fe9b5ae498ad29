"""A student's view: JupyterLab in a real browser runs a lecture notebook.

JupyterLab starts from the course environment on 127.0.0.1 with a token and isolated Jupyter
config/data/runtime folders, on a copy of the notebook (so nothing in the checkout changes).
Headless Chromium opens it, waits for the kernel, runs all cells, and checks that printed output
and a `!torchrun` cell's output appear, that an ipywidgets slider renders, and that moving it
with the keyboard changes what the notebook shows. Screenshots go to build/test-artifacts/.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from browser import ARTIFACTS, ROOT, chromium_or_skip, is_local, launch
from parallel_course.launch import _kill_group

NOTEBOOK = "00_setup_check.ipynb"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    """(base URL, token, folder served) of a JupyterLab stopped by PID at the end."""
    chromium_or_skip()
    served = tmp_path / "course"
    served.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, served)
    jupyter = {name: tmp_path / name for name in ("config", "data", "runtime")}
    for d in jupyter.values():
        d.mkdir()
    # No "news" toast over the notebook in a fresh profile.
    (jupyter["config"] / "labconfig").mkdir()
    (jupyter["config"] / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
    ))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(jupyter["config"]),
               JUPYTER_DATA_DIR=str(jupyter["data"]), JUPYTER_RUNTIME_DIR=str(jupyter["runtime"]),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={served}",
           "--KernelManager.transport_encryption=auto"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        # An unauthenticated request must be refused: never an open server.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/contents", timeout=5)
        assert refused.value.code == 403
        yield base, token, served
    finally:
        _kill_group(server.pid)  # the server, its kernels and their workers
        server.wait(timeout=30)
        log.close()


def test_a_student_runs_a_notebook_in_jupyterlab(jupyterlab):
    from playwright.sync_api import expect, sync_playwright

    base, token, _ = jupyterlab
    outside = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: None if is_local(r.url) else outside.append(r.url))
        page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
        # Kernel connected and idle before "Run All", or nothing runs.
        expect(page.get_by_text("| Idle").first).to_be_visible(timeout=90_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_text("Run All Cells", exact=True).click()

        # Printed output, and the output of a `!torchrun` cell (the last kind of cell to finish).
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        expect(notebook.locator(".jp-OutputArea-output").first).to_be_visible(timeout=60_000)
        expect(notebook.get_by_text("OK: every rank holds the sum").first).to_be_visible(timeout=180_000)
        expect(page.get_by_text("| Idle").first).to_be_visible(timeout=180_000)

        # An ipywidgets slider renders; moving it with the keyboard changes the display.
        slider = notebook.locator(".widget-hslider", has_text="processes").locator(".noUi-handle").first
        expect(slider).to_be_visible(timeout=30_000)
        slider.scroll_into_view_if_needed()
        view = slider.locator("xpath=ancestor::div[contains(@class,'jp-OutputArea-output')]")
        expect(view).to_contain_text("rank 1: cpu")
        expect(view).not_to_contain_text("rank 2:")
        slider.focus()
        page.keyboard.press("ArrowRight")  # 2 -> 3 processes: the kernel recomputes the placement
        expect(view).to_contain_text("rank 2: ", timeout=20_000)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab_widget.png"))
        browser.close()
    errors = [u for u in outside]
    assert not errors, f"JupyterLab made requests that leave the machine: {errors}"
