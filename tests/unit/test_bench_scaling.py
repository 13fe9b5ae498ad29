"""bench_scaling.py's plain-python run: its torchrun jobs start before it touches a GPU (a CUDA
context it kept would make a GPU in exclusive-process mode refuse theirs), and its table says MiB
for sizes divided by 2**20. The measurements are faked: the order of the calls is the point."""

import sys

import torch

from helpers import load_script


def fake_measure(args, device, launched, children):
    ddp = {"1": {"step_s": 0.01, "one_process_s": 0.01, "speedup": 1.0, "efficiency": 1.0}}
    return {
        "small": {
            "global_batch": 64,
            "parameters": 2**18,
            "gradient_bytes": 2**20,
            "ddp": ddp,
            "data_parallel": {"skipped": "not here"},
        }
    }


def run_main(monkeypatch, gpus: int):
    bench = load_script("bench_scaling.py")
    calls = []

    def fake_launch(n, args, out):
        calls.append(("launch", n))
        row = {"step_s": 0.006, "one_process_s": 0.01, "speedup": 1.6, "efficiency": 0.8}
        return {"models": {"small": {"ddp": {"1": {"step_s": 0.01}, str(n): row}}}}

    def fake_setup():
        calls.append(("setup", None))
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
        return torch.device("cpu")

    monkeypatch.setattr(bench, "launch", fake_launch)
    monkeypatch.setattr(bench, "setup", fake_setup)
    monkeypatch.setattr(bench, "measure_here", fake_measure)
    monkeypatch.setattr(bench.torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(sys, "argv", ["bench_scaling.py", "--model", "small", "--nproc-list", "1,2,4"])
    monkeypatch.delenv("RANK", raising=False)
    try:
        assert bench.main() == 0
    finally:
        bench.teardown()
    return calls


def test_the_jobs_run_before_this_process_joins_or_touches_a_gpu(monkeypatch, capsys):
    calls = run_main(monkeypatch, gpus=0)
    assert calls == [("launch", 2), ("launch", 4), ("setup", None)], calls
    out = capsys.readouterr().out
    assert "(1.00 MiB of gradients)" in out and " MB of" not in out, out
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith(" DDP")]
    assert rows == [["DDP", "1"], ["DDP", "2"], ["DDP", "4"]], out


def test_counts_above_the_gpus_are_skipped_before_any_job(monkeypatch, capsys):
    calls = run_main(monkeypatch, gpus=2)
    assert calls == [("launch", 2), ("setup", None)], calls
    assert "# DDP with 4 processes skipped: only 2 GPU(s)" in capsys.readouterr().out
