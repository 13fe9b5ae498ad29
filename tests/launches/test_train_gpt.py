"""scripts/train_gpt.py, the capstone's reference script: its arguments.

The layouts themselves (the same losses as one process in ddp, fsdp, tp and 2d with sequence
parallelism, each rank storing its share) are launched and asserted by notebook 11 under strict nbval, and on nccl by
tests/gpu/test_gpu.py; here the argument checks run in this process, and one bad command line as a
process: one error line, exit code 2, nothing written.
"""

import sys
from pathlib import Path

import pytest

from helpers import load_script
from parallel_course.launch import run_bounded

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_gpt.py"


@pytest.fixture(scope="module")
def train_gpt():
    return load_script(SCRIPT)


def test_a_bad_command_line_is_one_error_line(tmp_path):
    result = run_bounded([sys.executable, str(SCRIPT), "--steps", "0", "--out", str(tmp_path / "out")], timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == ["train_gpt.py: error: --steps and --global-batch-size must be at least 1"]
    assert result.stderr.splitlines()[-1] == errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, world_size, message",
    [
        (["--steps", "0"], 1, "must be at least 1"),
        (["--global-batch-size", "-1"], 1, "must be at least 1"),
        (["--lr", "nan"], 1, "--lr must be positive"),
        (["--digits", "5"], 1, "--digits must be 1 to 4"),
        (["--parallel", "pipeline"], 1, "invalid choice"),
        (["--parallel", "single"], 2, "--parallel single is one process, but the world size is 2"),
        (["--parallel", "2d"], 2, "--parallel 2d needs an even world size of at least 4, got 2"),
        (["--parallel", "2d", "--global-batch-size", "12"], 6, None),  # 3 x 2: fine
        (["--parallel", "2d", "--global-batch-size", "8"], 6, "not divisible by the 3 data-parallel ranks"),
        (["--parallel", "ddp", "--global-batch-size", "6"], 4, "not divisible by the 4 data-parallel ranks"),
        (["--parallel", "tp", "--global-batch-size", "7"], 4, None),  # tp: one data-parallel rank
        (["--parallel", "tp", "--sequence-parallel"], 2, None),
        (["--parallel", "fsdp", "--sequence-parallel"], 2, "--sequence-parallel needs --parallel tp or 2d, got fsdp"),
        (["OUT_IS_A_FILE"], 1, "exists and is not a folder"),
        ([], 1, "required: --out"),
    ],
)
def test_arguments(train_gpt, tmp_path, monkeypatch, capsys, args, world_size, message):
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    argv = [a for a in args if a != "OUT_IS_A_FILE"]
    if "OUT_IS_A_FILE" in args:
        (tmp_path / "file").write_text("")
        argv += ["--out", str(tmp_path / "file")]
    elif args:
        argv += ["--out", str(tmp_path / "out")]
    if message is None:
        assert train_gpt.parse_args(argv).out == tmp_path / "out"
        return
    with pytest.raises(SystemExit) as exit_info:
        train_gpt.parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert message in err[-1] and sum("error" in line for line in err) == 1, err


def test_mesh_shapes(train_gpt):
    assert [train_gpt.mesh_shape(layout, 4) for layout in train_gpt.LAYOUTS] == [(4, 1), (4, 1), (4, 1), (1, 4), (2, 2)]
