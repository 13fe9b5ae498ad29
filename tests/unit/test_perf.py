"""Chapter 06's helpers: bandwidths and the α–β fit (bandwidth), scaling figures and overlap (scaling),
trace reading (profiler_traces), threads and saved-for-backward bytes (resource_use), plots (bench_plots)."""

import math
import os

import matplotlib
import pytest

from parallel_course import bandwidth, bench_plots, profiler_traces, resource_use, scaling

matplotlib.use("Agg")


def test_bus_factor_and_bandwidths():
    assert bandwidth.bus_factor(1) == 0
    assert bandwidth.bus_factor(2) == 1
    assert bandwidth.bus_factor(4) == 1.5
    assert bandwidth.algbw(2e9, 2.0) == 1e9
    assert bandwidth.busbw(2e9, 2.0, 4) == 1.5e9  # nccl-tests: busbw = algbw * 2(N-1)/N
    assert bandwidth.busbw(2e9, 2.0, 1) == 0
    with pytest.raises(ValueError):
        bandwidth.algbw(1, 0)
    with pytest.raises(ValueError):
        bandwidth.bus_factor(0)


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_alpha_beta_fit_recovers_the_model(world_size):
    alpha, beta = 50e-6, 2e9
    sizes = [2**k for k in range(10, 27, 2)]
    times = [alpha + bandwidth.bus_factor(world_size) * s / beta for s in sizes]
    fit = bandwidth.fit_alpha_beta(sizes, times, world_size)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-9)
    assert fit.predict_s(2**20) == pytest.approx(alpha + bandwidth.bus_factor(world_size) * 2**20 / beta)
    # at S½ latency and bandwidth cost the same
    half = fit.half_bandwidth_bytes()
    assert bandwidth.bus_factor(world_size) * half / beta == pytest.approx(alpha)


def test_alpha_beta_fit_weighs_relative_error():
    """A 10 % error on the largest message must not swamp the small messages' latency."""
    alpha, beta = 100e-6, 1e9
    sizes = [2**k for k in range(10, 25)]
    times = [alpha + s / beta for s in sizes]
    times[-1] *= 1.10
    fit = bandwidth.fit_alpha_beta(sizes, times, 2)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05)


@pytest.mark.parametrize(
    "sizes, times, n, message",
    [
        ([1], [1.0], 2, "at least two"),
        ([1, 2], [1.0], 2, "at least two"),
        ([1, 2], [1.0, 2.0], 1, "one rank"),
        ([1, 2], [1.0, 0.0], 2, "positive"),
        ([4, 4], [1.0, 2.0], 2, "different sizes"),
        ([1, 1000], [2.0, 1.0], 2, "does not grow"),
    ],
)
def test_alpha_beta_fit_refuses_what_it_cannot_fit(sizes, times, n, message):
    with pytest.raises(ValueError, match=message):
        bandwidth.fit_alpha_beta(sizes, times, n)


def test_median_of_slowest_takes_the_max_per_iteration_then_the_median():
    rank0 = [1.0, 5.0, 2.0]
    rank1 = [3.0, 1.0, 2.5]
    assert bandwidth.median_of_slowest([rank0, rank1]) == 3.0  # max per step: 3, 5, 2.5
    with pytest.raises(ValueError):
        bandwidth.median_of_slowest([[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError):
        bandwidth.median_of_slowest([])


def test_speedup_efficiency_overlap():
    assert scaling.speedup(180.0, 100.0) == 1.8
    assert scaling.efficiency(180.0, 100.0, 2) == 0.9
    assert scaling.overlap_fraction(t_compute=10, t_comm=4, t_step=10) == 1.0  # fully hidden
    assert scaling.overlap_fraction(t_compute=10, t_comm=4, t_step=14) == 0.0  # simply added
    assert scaling.overlap_fraction(t_compute=10, t_comm=4, t_step=12) == 0.5
    assert scaling.overlap_fraction(t_compute=10, t_comm=4, t_step=16) == -0.5  # slower together
    with pytest.raises(ValueError):
        scaling.overlap_fraction(1, 0, 1)
    with pytest.raises(ValueError):
        scaling.efficiency(1, 1, 0)
    with pytest.raises(ValueError):
        scaling.speedup(1, 0)


def test_interval_helpers():
    assert profiler_traces.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert profiler_traces.union_length([(0, 10), (2, 3)]) == 10
    assert profiler_traces.union_length([]) == 0
    assert profiler_traces.clip([(0, 2), (3, 8), (9, 12)], 1, 10) == [(1, 2), (3, 8), (9, 10)]


def x(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat, "args": args}


def test_trace_steps_on_a_cpu_trace():
    """Two steps; autograd computes 10-40 µs inside backward (which waits until 60)."""
    events = []
    for base in [0, 100]:
        events += [
            x("train_step", base, 90, cat="user_annotation"),
            x("backward", base + 10, 50, cat="user_annotation"),
            x("autograd::engine::evaluate_function: AddmmBackward0", base + 10, 15),
            x("autograd::engine::evaluate_function: AddmmBackward0", base + 28, 12),
            x("c10d::allreduce_", base + 25, 1),
            x("gloo:all_reduce", base + 26, 10, tid=2),  # 26-36: inside the computation (ends at 40)
            x("gloo:all_reduce", base + 41, 15, tid=2),  # 41-56: after it
        ]
    events.append({"ph": "M", "name": "thread_name"})
    steps = profiler_traces.trace_steps({"traceEvents": events})
    assert len(steps) == 2
    for k, s in enumerate(steps):
        assert s["allreduces"] == 2
        assert s["backward"] == (100 * k + 10, 100 * k + 40)
        assert s["comm_us"] == 25
        assert s["hidden_us"] == 10
        assert s["starts_before_backward_ends"] is True


def test_describe_trace_times_each_bar_in_the_alt_and_leaves_them_out_of_the_plain_text():
    steps = [
        {
            "allreduces": 2,
            "backward": (1000, 4000),
            "comm_us": 2500,
            "hidden_us": 1000,
            "starts_before_backward_ends": True,
            "allreduce_spans": [(2600, 3600), (4100, 5600)],
        },
        {
            "allreduces": 1,
            "backward": (11000, 14000),
            "comm_us": 1000,
            "hidden_us": 0,
            "starts_before_backward_ends": False,
            "allreduce_spans": [(14500, 15500)],
        },
    ]
    top = [{"name": "gloo:all_reduce", "self_cpu_us": 2500}, {"name": "aten::addmm", "self_cpu_us": 1200}]
    alt, plain = profiler_traces.describe_trace(steps, top, "self_cpu_us")
    assert "Step 1: backward from 0.0 to 3.0 ms; 2 all-reduces, 1.6 to 2.6, 3.1 to 4.6 ms; 40% of their time" in alt
    assert "Step 2: backward from 10.0 to 13.0 ms; 1 all-reduce, 13.5 to 14.5 ms; 0% of" in alt
    assert "the 2 operators with the most CPU self time" in alt
    assert alt.endswith("Busiest operators: gloo:all_reduce 2.5 ms; aten::addmm 1.2 ms.")
    assert (
        "Step 1: 2 all-reduces, the first one before backward ended, step 2: 1 all-reduce, the first one after" in plain
    )
    assert " ms;" not in plain and "addmm" not in plain


def test_trace_steps_when_communication_starts_after_backward():
    events = [
        x("train_step", 0, 90, cat="user_annotation"),
        x("backward", 10, 50, cat="user_annotation"),
        x("autograd::engine::evaluate_function: AddmmBackward0", 10, 20),
        x("gloo:all_reduce", 35, 10, tid=2),
    ]
    (s,) = profiler_traces.trace_steps({"traceEvents": events})
    assert s["hidden_us"] == 0 and s["starts_before_backward_ends"] is False


def test_trace_steps_on_a_gpu_trace_uses_the_kernels():
    """The CPU launches kernels during backward (0-20); the GPU runs them later (100-160)."""
    events = [
        x("train_step", 0, 200, cat="user_annotation"),
        x("backward", 0, 20, cat="user_annotation"),
        x("cudaLaunchKernel", 5, 1, cat="cuda_runtime", correlation=1),
        x("cudaLaunchKernel", 15, 1, cat="cuda_runtime", correlation=2),
        x("cudaLaunchKernel", 50, 1, cat="cuda_runtime", correlation=3),  # optimizer, not backward
        x("sgemm_kernel", 100, 30, tid=7, cat="kernel", correlation=1),
        x("sgemm_kernel", 130, 30, tid=7, cat="kernel", correlation=2),
        x("sgd_kernel", 170, 5, tid=7, cat="kernel", correlation=3),
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 120, 30, tid=8, cat="kernel", correlation=4),
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 155, 10, tid=8, cat="kernel", correlation=5),
    ]
    (s,) = profiler_traces.trace_steps({"traceEvents": events})
    assert s["backward"] == (100, 160)
    assert s["allreduces"] == 2
    assert s["comm_us"] == 40 and s["hidden_us"] == 35
    assert s["starts_before_backward_ends"] is True


ALLREDUCE_REPORT = {
    "world_size": 2,
    "backend": "gloo",
    "device": "cpu",
    "iters": 10,
    "impls": {
        impl: {
            "sizes": [
                {"bytes": s, "time_s": 1e-4 + s / bw, "busbw_bytes_per_s": s / (1e-4 + s / bw)}
                for s in (1024, 2**16, 2**20, 2**24)
            ]
        }
        for impl, bw in (("torch", 1e9), ("ring", 8e8))
    },
}


def scaling_report():
    """bench_scaling.py's JSON: each configuration with the one-process step timed beside it."""

    def ddp(step, one_process, n, compute=None, comm=None):
        r = {
            "step_s": step,
            "one_process_s": one_process,
            "samples_per_s": 64 / step,
            "speedup": one_process / step,
            "efficiency": one_process / step / n,
            "overlap": None,
        }
        if n > 1:
            r.update(compute_s=compute, comm_s=comm, overlap=scaling.overlap_fraction(compute, comm, step))
        return r

    return {
        "backend": "gloo",
        "device": "cpu",
        "gpus": 0,
        "threads_per_process": 1,
        "models": {
            "small": {
                "global_batch": 64,
                "data_parallel": {"skipped": "needs GPUs"},
                "ddp": {"1": ddp(0.0012, 0.001, 1), "2": ddp(0.003, 0.001, 2, 0.0008, 0.001)},
            },
            "compute": {
                "global_batch": 64,
                "data_parallel": {"skipped": "needs GPUs"},
                "ddp": {"2": ddp(0.044, 0.08, 2, 0.04, 0.004), "1": ddp(0.081, 0.08, 1)},
            },
        },
    }


def test_plots_draw_without_error():
    import matplotlib.pyplot as plt

    ax = bench_plots.plot_bandwidth(ALLREDUCE_REPORT)
    assert len(ax.lines) == 4  # measured + fit, for each implementation
    fig = bench_plots.plot_scaling(scaling_report())
    assert len(fig.axes) == 3
    plt.close("all")


def test_scaling_rows_in_process_order():
    rows = scaling.scaling_rows(scaling_report(), "compute")
    assert [(label, n) for label, n, _ in rows] == [("DDP", 1), ("DDP", 2)]
    two = rows[1][2]
    assert math.isclose(two["efficiency"], scaling.efficiency(64 / 0.044, 64 / 0.08, 2))


def test_threads_that_computed_sees_torch_threads():
    import torch

    if resource_use.threads_that_computed(lambda: None) is None:
        pytest.skip("no /proc/self/task on this system")
    a = torch.randn(512, 512)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert resource_use.threads_that_computed(lambda: [a @ a for _ in range(20)]) == 1
        if (os.cpu_count() or 1) >= 2:
            torch.set_num_threads(2)
            assert resource_use.threads_that_computed(lambda: [a @ a for _ in range(20)]) == 2
    finally:
        torch.set_num_threads(before)


def test_threads_that_computed_without_proc(monkeypatch):
    monkeypatch.setattr(resource_use.os.path, "isdir", lambda path: False)
    assert resource_use.threads_that_computed(lambda: None) is None


def tiny_model_and_batch():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.randn(8, 16), torch.randint(0, 4, (8,))


def test_saved_for_backward_in_float32():
    """float32: the second layer's weight is saved by reference (no new memory); the input too."""
    import torch.nn.functional as F

    model, x, y = tiny_model_and_batch()
    saved = resource_use.saved_for_backward(lambda: F.cross_entropy(model(x), y), model.parameters(), (x, y))
    assert saved["parameters and inputs"] == 4 * 32 * 4 + 8 * 16 * 4 + 8 * 8  # W2, x, y (int64)
    assert saved["copies of parameters"] == 0
    assert saved["activations"] >= 8 * 32 * 4  # at least the ReLU's output


def test_saved_for_backward_under_autocast_counts_the_16_bit_weights():
    """autocast: the 16-bit copy of W2 is new memory; the activations are 16-bit (smaller)."""
    import torch
    import torch.nn.functional as F

    model, x, y = tiny_model_and_batch()

    def loss(enabled):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            return F.cross_entropy(model(x), y)

    fp32 = resource_use.saved_for_backward(lambda: loss(False), model.parameters(), (x, y))
    amp = resource_use.saved_for_backward(lambda: loss(True), model.parameters(), (x, y))
    assert amp["copies of parameters"] == 4 * 32 * 2  # W2 in bfloat16
    assert amp["parameters and inputs"] == 8 * 8  # only y: x is saved as a 16-bit copy
    assert amp["activations"] < fp32["activations"]
    assert all(p.grad is not None for p in model.parameters())  # backward ran, the graph is freed


def test_describe_iterations_gives_the_times_in_alt_and_not_in_plain():
    alt, plain = bench_plots.describe_iterations([3.0, 1.0, 2.0], "cpu")
    assert "3 timings" in alt and "3.00, 1.00, 2.00 ms" in alt and "median 2.00 ms, mean 2.00 ms" in alt
    assert "on cpu" in plain and "1.00" not in plain


def test_describe_bandwidth_gives_each_size_and_the_fit_in_alt_and_not_in_plain():
    alt, plain = bench_plots.describe_bandwidth(ALLREDUCE_REPORT)
    # 16 MiB at 1 GB/s after 100 µs: busbw = algbw = 16777216 / 0.016877216 s
    assert "16777216 B: 0.994 GB/s" in alt and "ring: 1024 B:" in alt
    assert "fit α = 100 µs, β = 1.00 GB/s" in alt
    assert "2 ranks, gloo on cpu" in plain and "torch, ring" in plain and "GB/s:" not in plain and "α =" not in plain
