"""parallel_course.perf: bandwidths, the α–β fit, scaling figures, overlap, trace reading, plots."""

import math

import matplotlib
import pytest

from parallel_course import perf

matplotlib.use("Agg")


def test_bus_factor_and_bandwidths():
    assert perf.bus_factor(1) == 0
    assert perf.bus_factor(2) == 1
    assert perf.bus_factor(4) == 1.5
    assert perf.algbw(2e9, 2.0) == 1e9
    assert perf.busbw(2e9, 2.0, 4) == 1.5e9  # nccl-tests: busbw = algbw * 2(N-1)/N
    assert perf.busbw(2e9, 2.0, 1) == 0
    with pytest.raises(ValueError):
        perf.algbw(1, 0)
    with pytest.raises(ValueError):
        perf.bus_factor(0)


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_alpha_beta_fit_recovers_the_model(world_size):
    alpha, beta = 50e-6, 2e9
    sizes = [2**k for k in range(10, 27, 2)]
    times = [alpha + perf.bus_factor(world_size) * s / beta for s in sizes]
    fit = perf.fit_alpha_beta(sizes, times, world_size)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-9)
    assert fit.predict_s(2**20) == pytest.approx(alpha + perf.bus_factor(world_size) * 2**20 / beta)
    # at S½ latency and bandwidth cost the same
    half = fit.half_bandwidth_bytes()
    assert perf.bus_factor(world_size) * half / beta == pytest.approx(alpha)


def test_alpha_beta_fit_weighs_relative_error():
    """A 10 % error on the largest message must not swamp the small messages' latency."""
    alpha, beta = 100e-6, 1e9
    sizes = [2**k for k in range(10, 25)]
    times = [alpha + s / beta for s in sizes]
    times[-1] *= 1.10
    fit = perf.fit_alpha_beta(sizes, times, 2)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05)


@pytest.mark.parametrize("sizes, times, n, message", [
    ([1], [1.0], 2, "at least two"),
    ([1, 2], [1.0], 2, "at least two"),
    ([1, 2], [1.0, 2.0], 1, "one rank"),
    ([1, 2], [1.0, 0.0], 2, "positive"),
    ([4, 4], [1.0, 2.0], 2, "different sizes"),
    ([1, 1000], [2.0, 1.0], 2, "does not grow"),
])
def test_alpha_beta_fit_refuses_what_it_cannot_fit(sizes, times, n, message):
    with pytest.raises(ValueError, match=message):
        perf.fit_alpha_beta(sizes, times, n)


def test_median_of_slowest_takes_the_max_per_iteration_then_the_median():
    rank0 = [1.0, 5.0, 2.0]
    rank1 = [3.0, 1.0, 2.5]
    assert perf.median_of_slowest([rank0, rank1]) == 3.0  # max per step: 3, 5, 2.5
    with pytest.raises(ValueError):
        perf.median_of_slowest([[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError):
        perf.median_of_slowest([])


def test_speedup_efficiency_overlap():
    assert perf.speedup(180.0, 100.0) == 1.8
    assert perf.efficiency(180.0, 100.0, 2) == 0.9
    assert perf.overlap_fraction(t_compute=10, t_comm=4, t_step=10) == 1.0  # fully hidden
    assert perf.overlap_fraction(t_compute=10, t_comm=4, t_step=14) == 0.0  # simply added
    assert perf.overlap_fraction(t_compute=10, t_comm=4, t_step=12) == 0.5
    assert perf.overlap_fraction(t_compute=10, t_comm=4, t_step=16) == -0.5  # slower together
    with pytest.raises(ValueError):
        perf.overlap_fraction(1, 0, 1)
    with pytest.raises(ValueError):
        perf.efficiency(1, 1, 0)
    with pytest.raises(ValueError):
        perf.speedup(1, 0)


def test_interval_helpers():
    assert perf.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert perf.union_length([(0, 10), (2, 3)]) == 10
    assert perf.union_length([]) == 0
    assert perf.clip([(0, 2), (3, 8), (9, 12)], 1, 10) == [(1, 2), (3, 8), (9, 10)]


def x(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat, "args": args}


def test_trace_steps_on_a_cpu_trace():
    """Two steps; autograd computes 10-40 µs inside backward (which waits until 60)."""
    events = []
    for k, base in enumerate([0, 100]):
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
    steps = perf.trace_steps({"traceEvents": events})
    assert len(steps) == 2
    for k, s in enumerate(steps):
        assert s["allreduces"] == 2
        assert s["backward"] == (100 * k + 10, 100 * k + 40)
        assert s["comm_us"] == 25
        assert s["hidden_us"] == 10
        assert s["starts_before_backward_ends"] is True


def test_trace_steps_when_communication_starts_after_backward():
    events = [
        x("train_step", 0, 90, cat="user_annotation"),
        x("backward", 10, 50, cat="user_annotation"),
        x("autograd::engine::evaluate_function: AddmmBackward0", 10, 20),
        x("gloo:all_reduce", 35, 10, tid=2),
    ]
    (s,) = perf.trace_steps({"traceEvents": events})
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
    (s,) = perf.trace_steps({"traceEvents": events})
    assert s["backward"] == (100, 160)
    assert s["allreduces"] == 2
    assert s["comm_us"] == 40 and s["hidden_us"] == 35
    assert s["starts_before_backward_ends"] is True


ALLREDUCE_REPORT = {
    "world_size": 2, "backend": "gloo", "device": "cpu", "iters": 10,
    "impls": {impl: {"sizes": [{"bytes": s, "time_s": 1e-4 + s / bw,
                                "busbw_bytes_per_s": s / (1e-4 + s / bw)} for s in (1024, 2**16, 2**20, 2**24)]}
              for impl, bw in (("torch", 1e9), ("ring", 8e8))},
}


def scaling_report():
    def ddp(step, compute, comm, n):
        return {"step_s": step, "compute_s": compute, "comm_s": comm,
                "overlap": perf.overlap_fraction(compute, comm, step) if n > 1 else None,
                "samples_per_s": 64 / step}
    return {"backend": "gloo", "device": "cpu", "gpus": 0, "threads_per_process": 1,
            "models": {"small": {"global_batch": 64, "one_process": {"step_s": 0.001, "samples_per_s": 64000},
                                 "data_parallel": {"skipped": "needs GPUs"},
                                 "ddp": {"1": ddp(0.0012, 0.0011, 0.0001, 1), "2": ddp(0.003, 0.0008, 0.001, 2)}},
                       "compute": {"global_batch": 64, "one_process": {"step_s": 0.08, "samples_per_s": 800},
                                   "data_parallel": {"skipped": "needs GPUs"},
                                   "ddp": {"1": ddp(0.081, 0.08, 0.001, 1), "2": ddp(0.044, 0.04, 0.004, 2)}}}}


def test_plots_draw_without_error():
    import matplotlib.pyplot as plt

    ax = perf.plot_bandwidth(ALLREDUCE_REPORT)
    assert len(ax.lines) == 4  # measured + fit, for each implementation
    fig = perf.plot_scaling(scaling_report())
    assert len(fig.axes) == 3
    plt.close("all")


def test_scaling_rows_lists_the_baseline_first():
    rows = perf.scaling_rows(scaling_report(), "compute")
    assert [(label, n) for label, n, _ in rows] == [("one process", 1), ("DDP", 1), ("DDP", 2)]
    assert math.isclose(perf.efficiency(rows[2][2]["samples_per_s"], rows[0][2]["samples_per_s"], 2),
                        (64 / 0.044) / 800 / 2)
