"""scripts/train_ddp.py, the reference script (chapter 04's c04_train_ddp.py, grown in chapter 09).

- the same final weights (within 1e-5) at world sizes 1 (plain python) and 4 (torchrun) with the
  same global batch, and a well-formed metrics.json whose loss falls (world size 2 against 1:
  notebook 10, over two emulated nodes, within 1e-6);
- bad arguments end in one line on stderr and a non-zero exit; --help exits 0.
"""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from helpers import job_command, launch, load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_ddp.py"
TRAIN_ARGS = ["--epochs", "3", "--global-batch-size", "32", "--samples", "256", "--seed", "1"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Output folders of the runs at world sizes 1 and 4."""
    base = tmp_path_factory.mktemp("train_ddp")
    outs = {}
    for world_size, nproc in [(1, None), (4, 4)]:
        out = base / f"n{world_size}"
        result = launch(job_command(SCRIPT, nproc, *TRAIN_ARGS, "--out", out))
        assert result.returncode == 0, result.stderr[-3000:]
        outs[world_size] = out
    return outs


def weights(out):
    state = torch.load(out / "final.pt", map_location="cpu", weights_only=True)
    return {k: v for k, v in state.items()}


@pytest.mark.parametrize("world_size", [4])
def test_same_weights_as_one_process(runs, world_size):
    one, many = weights(runs[1]), weights(runs[world_size])
    assert one.keys() == many.keys() == {"linear.weight", "linear.bias"}
    diff = max((one[k] - many[k]).abs().max().item() for k in one)
    assert diff <= TOLERANCE, f"world size {world_size}: max |dW| = {diff:.3g} > {TOLERANCE}"


@pytest.mark.parametrize("world_size", [1, 4])
def test_metrics_json(runs, world_size):
    metrics = json.loads((runs[world_size] / "metrics.json").read_text())
    assert metrics["world_size"] == world_size
    assert metrics["global_batch_size"] == 32
    loss = metrics["loss"]
    assert len(loss) == metrics["epochs"] == 3
    assert all(isinstance(value, float) and math.isfinite(value) for value in loss)
    assert loss[-1] < loss[0] / 2, f"the loss should fall: {loss}"
    one = json.loads((runs[1] / "metrics.json").read_text())["loss"]
    assert loss == pytest.approx(one, rel=1e-4), "the logged loss is the global mean at every world size"


def test_bad_argument_from_the_command_line(tmp_path):
    result = launch(job_command(SCRIPT, None, "--epochs", "0", "--out", tmp_path / "out"), timeout=60)
    assert result.returncode != 0
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == ["train_ddp.py: error: --epochs, --samples and --global-batch-size must be at least 1"]
    assert result.stderr.splitlines()[-1] == errors[0]
    assert not (tmp_path / "out").exists()


def test_help(tmp_path):
    result = launch(job_command(SCRIPT, None, "--help"), timeout=60)
    assert result.returncode == 0, result.stderr
    for option in ["--epochs", "--global-batch-size", "--samples", "--seed", "--lr", "--out"]:
        assert option in result.stdout


@pytest.fixture(scope="module")
def train_ddp():
    """The script as a module, to check its argument parsing in this process (fast)."""
    return load_script(SCRIPT)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--epochs", "0"], "must be at least 1"),
        (["--samples", "-3"], "must be at least 1"),
        (["--global-batch-size", "0"], "must be at least 1"),
        (["--lr", "0"], "--lr must be positive"),
        (["--lr", "nan"], "--lr must be positive"),
        (["--epochs", "two"], "invalid int value"),
        (["--global-batch-size", "30", "WORLD_SIZE=4"], "not divisible by the world size 4"),
        (["OUT_IS_A_FILE"], "exists and is not a folder"),
        ([], "required: --out"),
    ],
    ids=["epochs", "samples", "batch", "lr0", "lr-nan", "epochs-text", "not-divisible", "out-file", "no-out"],
)
def test_bad_arguments(train_ddp, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = []
    for a in args:
        if a.startswith("WORLD_SIZE="):
            monkeypatch.setenv("WORLD_SIZE", a.split("=")[1])
        elif a == "OUT_IS_A_FILE":
            (tmp_path / "file").write_text("")
            argv += ["--out", str(tmp_path / "file")]
        else:
            argv.append(a)
    if args and "OUT_IS_A_FILE" not in args:
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        train_ddp.parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert message in err[-1] and err[-1].startswith(f"{Path(sys.argv[0]).name}: error: ")
    assert sum("error" in line for line in err) == 1
