"""teardown() leaves nothing of gloo running: a group alive while Python shuts down can abort a
finished job ("terminate called without an active exception"). Each holder found so far is put
back and must show up again, so that the check can fail for the mistake it is about."""

import sys
from pathlib import Path

import pytest

from parallel_course.launch import run_bounded

PROBE = Path(__file__).with_name("leave_group.py")

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from Linux's /proc")


def threads_left(mode: str) -> tuple[str, str]:
    result = run_bounded([sys.executable, str(PROBE), mode], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    return lines["while in the group"], lines["after leaving"]


def test_teardown_stops_gloos_threads():
    during, after = threads_left("teardown")
    assert "pt_gloo_runloop" in during
    assert after == "[]"


@pytest.mark.parametrize(
    "mode",
    [
        # DTensor's caches keep the mesh, and the mesh its group, unless teardown() releases them.
        "old-ending",
        # Imported once the group exists, torch.distributed.nn keeps it as a default argument.
        "late-import",
    ],
)
def test_each_holder_put_back_keeps_them_running(mode):
    _, after = threads_left(mode)
    assert "pt_gloo_runloop" in after
