"""The chapter-01 cost model, checked against numbers worked out by hand."""

import math

import pytest

from parallel_course import costmodel as cm

S = 100e6  # bytes of gradient
BW = 1e9  # bytes per second


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_one_worker_sends_nothing_and_is_the_baseline(algorithm):
    t = cm.traffic(algorithm, 1, S)
    assert (t.worker_sends, t.server_receives, t.messages) == (0, 0, 0)
    assert cm.comm_time(algorithm, 1, S, BW, latency=1e-3) == 0
    p = cm.predict(1, compute_s=0.2, model_bytes=S, bandwidth=BW, latency=1e-3, algorithm=algorithm)
    assert (p.step_s, p.speedup, p.efficiency) == (0.2, 1.0, 1.0)


def test_ring_bytes_per_rank():
    # 2(N-1)/N * S: N=2 -> S, N=4 -> 1.5 S, N=8 -> 1.75 S
    for n, factor in [(2, 1.0), (4, 1.5), (8, 1.75)]:
        t = cm.traffic("ring", n, S)
        assert t.worker_sends == pytest.approx(factor * S)
        assert t.worker_receives == pytest.approx(factor * S)
        assert t.messages == 2 * (n - 1)
        assert t.server_sends == t.server_receives == 0


def test_ring_bytes_approach_2S_and_never_exceed_it():
    sends = [cm.traffic("ring", n, S).worker_sends for n in (2, 16, 1024, 10**6)]
    assert sends == sorted(sends)
    assert all(x < 2 * S for x in sends)
    assert sends[-1] == pytest.approx(2 * S, rel=1e-5)


def test_parameter_server_bytes_grow_linearly_at_the_server():
    for n in (2, 4, 8, 16):
        t = cm.traffic("ps", n, S)
        assert (t.worker_sends, t.worker_receives) == (S, S)
        assert (t.server_receives, t.server_sends) == (n * S, n * S)
        assert t.messages == 2 * n


def test_message_time_alpha_beta():
    assert cm.message_time(1e9, 1e9, 1e-3) == pytest.approx(1.001)
    assert cm.message_time(0, 1e9, 5e-6) == pytest.approx(5e-6)


def test_comm_time_by_hand():
    # ring, N=4, S=100 MB, 1 GB/s, 1 ms: 6 steps of (1 ms + 25 MB / 1 GB/s = 25 ms) = 156 ms
    assert cm.comm_time("ring", 4, S, BW, 1e-3) == pytest.approx(6 * 0.026)
    # ps, N=4: 8 messages of (1 ms + 100 ms) = 808 ms
    assert cm.comm_time("ps", 4, S, BW, 1e-3) == pytest.approx(8 * 0.101)


def test_predict_without_overlap_adds_communication():
    p = cm.predict(4, compute_s=0.5, model_bytes=S, bandwidth=BW, algorithm="ring")
    assert p.comm_s == pytest.approx(0.15)  # 6 * 25 ms
    assert p.hidden_s == 0
    assert p.step_s == pytest.approx(0.65)
    assert p.speedup == pytest.approx(4 * 0.5 / 0.65)
    assert p.efficiency == pytest.approx(0.5 / 0.65)


def test_full_overlap_hides_communication_up_to_the_compute_time():
    # comm (0.15 s) shorter than compute (0.5 s): fully hidden, ideal speedup
    p = cm.predict(4, compute_s=0.5, model_bytes=S, bandwidth=BW, overlap=1.0)
    assert p.step_s == pytest.approx(0.5)
    assert p.speedup == pytest.approx(4.0)
    # comm (0.15 s) longer than compute (0.1 s): only 0.1 s hidden, step = comm
    p = cm.predict(4, compute_s=0.1, model_bytes=S, bandwidth=BW, overlap=1.0)
    assert p.hidden_s == pytest.approx(0.1)
    assert p.step_s == pytest.approx(0.15)
    # half overlap: half of the 0.15 s hidden
    p = cm.predict(4, compute_s=0.5, model_bytes=S, bandwidth=BW, overlap=0.5)
    assert p.step_s == pytest.approx(0.575)


def test_ring_beats_parameter_server_from_two_workers_on():
    for n in (2, 4, 8, 16):
        ring = cm.predict(n, compute_s=0.1, model_bytes=S, bandwidth=BW, algorithm="ring")
        ps = cm.predict(n, compute_s=0.1, model_bytes=S, bandwidth=BW, algorithm="ps")
        assert ring.step_s < ps.step_s


def test_ring_latency_term_grows_with_workers():
    # with no bytes at all only the 2(N-1) latencies remain
    assert cm.comm_time("ring", 8, 0, BW, 1e-3) == pytest.approx(14e-3)


def test_scaling_returns_one_prediction_per_worker_count():
    ps = cm.scaling([1, 2, 4], compute_s=1.0, model_bytes=S, bandwidth=BW)
    assert [p.world_size for p in ps] == [1, 2, 4]
    assert ps[0].speedup == 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world_size=0), "world_size must be at least 1, got 0"),
        (dict(world_size=-2), "world_size must be at least 1, got -2"),
        (dict(world_size=2.5), "world_size must be a whole number >= 1, got 2.5"),
        (dict(bandwidth=-1e9), "bandwidth must be a number >= 0, got -1000000000.0"),
        (dict(bandwidth=0), "bandwidth must be > 0, got 0.0"),
        (dict(latency=-1e-6), "latency must be a number >= 0, got -1e-06"),
        (dict(model_bytes=-1), "model_bytes must be a number >= 0, got -1"),
        (dict(compute_s=0), "compute_s must be > 0, got 0.0"),
        (dict(overlap=1.5), "overlap must be between 0 and 1, got 1.5"),
        (dict(overlap=-0.1), "overlap must be a number >= 0, got -0.1"),
        (dict(algorithm="tree"), "algorithm must be one of ('ring', 'ps'), got 'tree'"),
        (dict(bandwidth=math.nan), "bandwidth must be a number >= 0, got nan"),
        (dict(bandwidth=math.inf), "bandwidth must be finite, got inf"),
    ],
)
def test_bad_arguments_raise_one_clear_message(kwargs, message):
    args = dict(world_size=4, compute_s=0.1, model_bytes=S, bandwidth=BW, latency=0.0)
    args.update(kwargs)
    n = args.pop("world_size")
    with pytest.raises(ValueError) as info:
        cm.predict(n, **args)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_traffic_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        cm.traffic("ring", 0, S)
    with pytest.raises(ValueError, match="model_bytes must be a number >= 0"):
        cm.traffic("ps", 2, -5)
