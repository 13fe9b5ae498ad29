"""make gpu-check's core (tools/gpu_check.py) with fake nodes: GPUs, a torch version and modules
faked, the lanes' runs replaced by a recorder. Which lanes run, which skip and why, the table and
the JSON report; and the command itself on this machine without GPUs: every lane skipped."""

import json
import time

import pytest

import gpu_check as gc

ALL = dict.fromkeys((*gc.LANE_MODULES, *gc.NOTEBOOK_MODULES), True)


def node(gpus=1, torch="2.13.0+cu130", modules=None, nccl=True):
    entries = [f"GPU-{k:04d}" for k in range(gpus)]
    return gc.Facts(torch, gpus > 0, entries, nccl, {**ALL, **(modules or {})}, "" if gpus else "no NVIDIA GPU")


def recorder(ran):
    def run(lane, facts, timeout):
        ran.append((lane.name, gc.lane_environment(lane, facts).get("CUDA_VISIBLE_DEVICES"), timeout))
        return gc.Result(lane.name, "passed", "3 passed", 1.0, {"passed": 3})

    return run


def by_lane(results):
    return {r.lane: (r.result, r.reason) for r in results}


def test_without_gpus_every_lane_is_skipped_with_its_reason():
    ran = []
    results = gc.check(node(gpus=0), budget=480, runner=recorder(ran))
    assert ran == [] and results
    assert all(r.result == "skipped" and r.reason == "no NVIDIA GPU" for r in results), results
    assert "notebooks" in by_lane(results)


def test_one_gpu_and_an_older_torch():
    ran = []
    results = by_lane(gc.check(node(gpus=1, torch="2.11.0+cu128"), budget=480, runner=recorder(ran)))
    # The short lanes before the scripts' long one, so that a budget spent on the scripts leaves them run.
    assert [name for name, *_ in ran] == ["CUDA mixed precision", "memory", "scripts on nccl, 1 GPU(s)"]
    assert ran[2][1] == "GPU-0000"  # the first visible GPU, by its UUID
    assert results["nccl-only paths"] == ("skipped", "needs 2 GPUs, the node has 1")
    # Features the course needs torch 2.13 for refuse in one line naming both versions.
    for lane in ("notebooks", "flight recorder"):
        assert results[lane] == ("skipped", "needs torch 2.13 or newer; this is torch 2.11.0+cu128"), lane


def test_every_gpu_count_the_node_has():
    ran = []
    gc.check(node(gpus=8), budget=480, runner=recorder(ran))
    scripts = [(name, visible) for name, visible, _ in ran if name.startswith("scripts")]
    assert [name for name, _ in scripts] == [f"scripts on nccl, {n} GPU(s)" for n in (1, 2, 4, 8)]
    assert [visible.count(",") + 1 for _, visible in scripts] == [1, 2, 4, 8]
    assert {name for name, *_ in ran} >= {"notebooks", "flight recorder", "nccl-only paths", "capstone layouts"}
    assert gc.gpu_counts(3) == [1, 2, 3] and gc.gpu_counts(0) == [1]


def test_missing_modules_and_nccl_are_named():
    results = by_lane(gc.check(node(gpus=2, modules={"nbval": False}), budget=480, runner=recorder([])))
    result, reason = results["notebooks"]
    assert result == "skipped" and reason.startswith("nbval not installed"), reason
    assert results["scripts on nccl, 2 GPU(s)"][0] == "passed"
    results = by_lane(gc.check(node(gpus=2, modules={"pytest": False}), budget=480, runner=recorder([])))
    assert all(r == "skipped" and "pytest" in why for r, why in results.values()), results
    results = gc.check(node(gpus=2, nccl=False), budget=480, runner=recorder([]))
    assert {r.reason for r in results} == {"torch 2.13.0+cu130 has no nccl"}


def test_the_budget_is_shared_and_a_spent_one_skips_the_rest():
    ran = []

    def slow(lane, facts, timeout):
        ran.append(timeout)
        time.sleep(0.05)
        return gc.Result(lane.name, "stopped", "the time budget ran out", timeout)

    results = gc.check(node(gpus=1), budget=0.05, runner=slow)
    assert len(ran) == 1 and ran[0] <= 0.05
    results = by_lane(results)
    for lane in ("memory", "scripts on nccl, 1 GPU(s)", "notebooks"):
        assert results[lane] == ("skipped", "the time budget was spent before it"), lane
    assert results["nccl-only paths"] == ("skipped", "needs 2 GPUs, the node has 1")  # the node's reason first


def test_pytest_output_read_into_a_verdict():
    output = "\n".join(
        [
            "tests/gpu/test_gpu.py::test_every_script_at_every_gpu_works[hello_allreduce.py] PASSED [ 10%]",
            "tests/gpu/test_gpu.py::test_every_script_at_every_gpu_works[c13a_context_parallel.py] SKIPPED [ 20%]",
            "SKIPPED [1] tests/gpu/test_gpu.py:700: refused on 1 GPU(s): c13a_context_parallel.py: error: runs on 4",
        ]
    )
    counts, failed, skipped = gc.read_pytest(output)
    assert counts == {"passed": 1, "skipped": 1} and failed == []
    lane = gc.lanes(1)[0]
    result, reason = gc.verdict(lane, counts, failed, skipped, stopped=False)
    assert result == "passed" and "refused on 1 GPU(s): c13a_context_parallel.py: error: runs on 4" in reason
    bad = output + "\ntests/gpu/test_gpu.py::test_bench_allreduce_on_nccl FAILED [ 30%]"
    assert gc.verdict(lane, *gc.read_pytest(bad), stopped=False)[0] == "failed"
    assert gc.verdict(lane, *gc.read_pytest(output), stopped=True)[0] == "stopped"
    assert gc.verdict(lane, {}, [], [], stopped=False) == ("failed", "no test ran")
    assert gc.verdict(lane, {"skipped": 2}, [], ["needs at least 2 CUDA GPUs, found 1"], False)[0] == "skipped"


def test_facts_come_from_torch_and_the_inherited_list(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.12.1+cu130")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb,GPU-cccc")
    facts = gc.gather_facts()
    assert (facts.torch, facts.cuda, facts.gpus, facts.nccl) == ("2.12.1+cu130", True, ["GPU-aaaa", "GPU-bbbb"], True)
    assert facts.modules["pytest"] is True


def test_the_command_on_this_machine_skips_every_lane(tmp_path, capsys):
    """Here, without GPUs: the command runs to its end, every lane skipped with its reason, one table
    and the JSON report."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a machine with GPUs: the fake nodes above cover the logic")
    assert gc.main(["--json", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"gpu-check: torch {torch.__version__}, 0 GPU(s)")
    assert out[1].split() == ["lane", "result", "reason", "time"]
    rows = out[2:-1]
    assert len(rows) == len(gc.lanes(0)) and all("  skipped  " in row for row in rows), out
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["result"] for r in report["results"]] == ["skipped"] * len(rows)
    # The reason is the CUDA check's, naming the torch build.
    assert {r["reason"] for r in report["results"]} == {report["facts"]["cuda_reason"]}
    assert torch.__version__ in report["facts"]["cuda_reason"]
    assert report["facts"]["torch"] == torch.__version__ and report["seconds"] < 120


def test_a_python_without_torch_is_told_in_one_line(monkeypatch, capsys):
    real = gc.importlib.util.find_spec
    monkeypatch.setattr(gc.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    with pytest.raises(SystemExit):
        gc.main([])
    err = capsys.readouterr().err.strip().splitlines()
    assert ": error: " in err[-1] and "has no torch" in err[-1], err
