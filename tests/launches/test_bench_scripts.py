"""scripts/bench_allreduce.py and scripts/bench_scaling.py (chapter 06a and 06b's benchmarks) at tiny sizes.

They are benchmarks: here we only check that they run (plain python and torchrun), that their
JSON is well-formed and consistent, and that they follow the reference-script contract
(--help, one-line errors). No timing is asserted. One piece of logic is checked exactly:
bench_scaling.py's model of DDP's buckets against DDP's reducer. (bench_allreduce.py's bandwidths
and alpha-beta fit are parallel_course.bandwidth's, tested in tests/unit/test_perf.py.)
"""

import itertools
import json
import math
from pathlib import Path

import pytest

from helpers import job_command, launch, load_script

ROOT = Path(__file__).resolve().parents[2]
ALLREDUCE = ROOT / "scripts" / "bench_allreduce.py"
SCALING = ROOT / "scripts" / "bench_scaling.py"


TINY_ALLREDUCE = ["--min-bytes", "1K", "--max-bytes", "16K", "--factor", "4", "--warmup", "1", "--iters", "3"]


def test_allreduce_under_torchrun_both_implementations(tmp_path):
    out = tmp_path / "ar.json"
    result = launch(job_command(ALLREDUCE, 2, *TINY_ALLREDUCE, "--impl", "both", "--json", out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "impl=torch" in result.stdout and "impl=ring" in result.stdout
    assert result.stdout.count("# alpha-beta fit: ") == 2  # fitted, or why not (latency-bound sizes)
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["backend"] in ("gloo", "nccl")
    assert report["results_checked"] is True
    assert set(report["impls"]) == {"torch", "ring"}
    for impl in report["impls"].values():
        assert [r["bytes"] for r in impl["sizes"]] == [1024, 4096, 16384]
        for r in impl["sizes"]:
            assert r["count"] == r["bytes"] // 4 and r["time_s"] > 0
            assert math.isclose(r["algbw_bytes_per_s"], r["bytes"] / r["time_s"])
            assert math.isclose(r["busbw_bytes_per_s"], r["algbw_bytes_per_s"] * 2 * (2 - 1) / 2)
        # fitted, or (latency-bound tiny sizes) the reason why not
        assert (impl["fit"] is None and "does not grow" in impl["no_fit"]) or (
            set(impl["fit"]) == {"alpha_s", "beta_bytes_per_s"} and impl["no_fit"] is None
        )


def test_allreduce_as_plain_python_and_quiet(tmp_path):
    out = tmp_path / "sub" / "ar.json"
    result = launch(job_command(ALLREDUCE, None, *TINY_ALLREDUCE, "--impl", "ring", "--json", out, "--quiet"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("\n") == 1 and "1 ranks" in result.stdout and "results checked: OK" in result.stdout
    report = json.loads(out.read_text())
    assert report["world_size"] == 1
    assert all(r["busbw_bytes_per_s"] == 0 for r in report["impls"]["ring"]["sizes"])  # nothing moves
    assert report["impls"]["ring"]["fit"] is None and "one rank" in report["impls"]["ring"]["no_fit"]


def test_scaling_whole_comparison(tmp_path):
    """--nproc-list 1,2: DDP on 1 in this process, DDP on 2 through torchrun; each beside one process."""
    out = tmp_path / "sc.json"
    args = ["--model", "both", "--global-batch-size", "8", "--steps", "2", "--warmup", "1", "--nproc-list", "1,2"]
    result = launch(job_command(SCALING, None, *args, "--timeout", "60", "--json", out), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "thread(s) per process" in result.stdout and "#configuration" in result.stdout
    assert "# overlap = (compute + comm - step) / comm" in result.stdout  # the column is explained
    report = json.loads(out.read_text())
    assert report["threads_per_process"] == 1 or report["device"] == "cuda"
    assert set(report["models"]) == {"small", "compute"}
    for m in report["models"].values():
        assert m["global_batch"] == 8 and m["parameters"] > 0
        if report["gpus"] < 2:
            assert "GPUs" in m["data_parallel"]["skipped"]
        assert set(m["ddp"]) == {"1", "2"}
        for n, r in m["ddp"].items():
            assert r["step_s"] > 0 and r["one_process_s"] > 0
            assert math.isclose(r["samples_per_s"], 8 / r["step_s"])
            assert math.isclose(r["speedup"], r["one_process_s"] / r["step_s"])
            assert math.isclose(r["efficiency"], r["speedup"] / int(n))
        one, two = m["ddp"]["1"], m["ddp"]["2"]
        assert one["overlap"] is None and "compute_s" not in one
        assert two["compute_s"] > 0 and two["comm_s"] > 0
        assert math.isclose(two["overlap"], (two["compute_s"] + two["comm_s"] - two["step_s"]) / two["comm_s"])
        assert sum(two["bucket_bytes"]) == m["gradient_bytes"] and two["buckets"] == len(two["bucket_bytes"])


@pytest.mark.parametrize(
    "script, options",
    [
        (ALLREDUCE, ["--min-bytes", "--max-bytes", "--impl", "--json", "--iters", "--quiet"]),
        (SCALING, ["--model", "--nproc-list", "--threads", "--json", "--global-batch-size", "--quiet"]),
    ],
)
def test_help(script, options, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script(script).parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in options:
        assert option in out


def test_bad_argument_from_the_command_line():
    result = launch(job_command(SCALING, None, "--steps", "0"), timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == ["bench_scaling.py: error: --steps and --threads must be at least 1, --warmup at least 0"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--min-bytes", "2"], "need 4 <= --min-bytes"),
        (["--min-bytes", "1M", "--max-bytes", "1K"], "need 4 <= --min-bytes"),
        (["--max-bytes", "lots"], "not a size"),
        (["--factor", "1"], "--factor must be at least 2"),
        (["--iters", "0"], "--iters and --threads >= 1"),
        (["--impl", "tree"], "invalid choice"),
    ],
)
def test_allreduce_bad_arguments(args, message, capsys):
    module = load_script(ALLREDUCE)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(args)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0]


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "widths",
    [[512] * 9, [256, 768, 768, 10], [32, 128, 128, 1], [512, 2048, 2048, 2048, 10]],
    ids=["8x512", "compute", "small", "wide"],
)
def test_bucket_model_is_what_ddp_builds(widths, one_rank_group):
    """bench_scaling.bucket_sizes == DDP's buckets after its first step, with bucket_cap_mb unset, 25 and 1.

    Unset: a 1 MiB first bucket, then 25 MiB (an 8-layer 512x512 MLP: 2 buckets). Passing 25
    explicitly: 25 MiB for every bucket (the same MLP: 1 bucket). The first step runs with one.
    """
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    script = load_script(SCALING)
    for cap in (None, 25, 1):
        torch.manual_seed(0)
        layers = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        ddp_model = DDP(model, bucket_cap_mb=cap)
        counts = []
        for _ in range(2):
            ddp_model(torch.randn(4, widths[0])).sum().backward()
            buckets = ddp_model.reducer._get_zeros_like_grad_buckets()
            counts.append([b.buffer().numel() * b.buffer().element_size() for b in buckets])
        expected = script.bucket_sizes([p.numel() * p.element_size() for p in model.parameters()], cap)
        assert len(counts[0]) == 1, "the first step runs with one bucket"
        assert counts[1] == expected, f"bucket_cap_mb={cap}"
    if widths == [512] * 9:  # the case the course quotes
        assert len(script.bucket_sizes([512 * 512 * 4, 512 * 4] * 8)) == 2
        assert len(script.bucket_sizes([512 * 512 * 4, 512 * 4] * 8, 25)) == 1


def test_allreduce_sizes_parse():
    module = load_script(ALLREDUCE)
    assert module.size_arg("64M") == 64 * 2**20
    assert module.size_arg("1K") == module.size_arg("1kb") == 1024
    assert module.size_arg("4096") == 4096


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--global-batch-size", "7", "--nproc-list", "1,2"], {}, "not divisible by 2"),
        (["--nproc-list", "1,x"], {}, "--nproc-list takes process counts"),
        (["--nproc-list", "0,2"], {}, "at least 1"),
        (["--nproc-list", "1,2"], {"RANK": "0", "WORLD_SIZE": "2"}, "run it with plain python"),
        (["--model", "huge"], {}, "invalid choice"),
        (["--bucket-cap-mb", "0"], {}, "must be positive"),
    ],
)
def test_scaling_bad_arguments(args, env, message, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    module = load_script(SCALING)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(args)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0]
