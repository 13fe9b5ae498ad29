"""parallel_course.parallelism_figures: what chapter 01's figures put where, from its two-stage net
and from the cost model's bytes."""

import pytest
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch

from parallel_course import costmodel
from parallel_course.parallelism_figures import (
    describe_splits,
    describe_traffic,
    link_loads,
    parallelism_splits,
    splits_figure,
    traffic_figure,
)

S = 100e6


def test_a_parameter_servers_link_carries_n_times_a_workers_and_a_rings_links_are_all_alike():
    for n in (2, 4, 8):
        server, *workers = link_loads("ps", n, S)
        assert server.name == "server" and len(workers) == n
        assert [w.name for w in workers] == [f"worker {r}" for r in range(n)]
        assert {(w.sends, w.receives) for w in workers} == {(S, S)}
        assert (server.sends, server.receives) == (n * S, n * S)
        ring = link_loads("ring", n, S)
        assert [r.name for r in ring] == [f"rank {r}" for r in range(n)]
        # 2(N-1)/N * S each way, on every rank's link: below 2S whatever N.
        assert {(r.sends, r.receives) for r in ring} == {(2 * (n - 1) / n * S, 2 * (n - 1) / n * S)}
        assert ring[0].sends == costmodel.traffic("ring", n, S).worker_sends


def test_traffic_figure_draws_one_machine_per_link_on_one_scale_of_width_and_the_busiest_links():
    fig = traffic_figure(S, 4, [2, 4, 8, 16])
    assert isinstance(fig, Figure)
    ps, ring, curves = fig.get_axes()
    assert [ps.get_title(), ring.get_title()] == ["parameter server, 4 workers", "ring all-reduce, 4 ranks"]
    assert [sum(isinstance(p, Circle) for p in ax.patches) for ax in (ps, ring)] == [5, 4]
    # The widest link is the server's (800 MB out + in), drawn 16 points wide; the rest to scale.
    assert sorted({round(line.get_linewidth(), 3) for line in ps.lines}) == [round(16 * 200 / 800, 3), 16.0]
    assert {round(line.get_linewidth(), 3) for line in ring.lines} == {round(16 * 300 / 800, 3)}
    # The busiest link against N: the server's grows as 2NS, a ring rank's as 4(N-1)/N S.
    drawn = {line.get_label(): list(line.get_ydata()) for line in curves.lines}
    assert drawn["parameter server's link"] == [400, 800, 1600, 3200]
    assert drawn["a worker's link"] == [200] * 4
    assert drawn["a ring rank's link"] == [200, 300, 350, 375]
    text = describe_traffic(S, 4, [2, 4, 8, 16])
    assert "the parameter server's link sends 400 MB and receives 400 MB, each worker's 100 MB each way" in text
    assert "every rank's link carries 150 MB each way" in text
    assert "a ring rank's link: 200 MB at N = 2, 300 MB at N = 4, 350 MB at N = 8, 375 MB at N = 16" in text


def test_the_two_splits_hold_what_chapter_01_computed_and_send_what_crosses():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    x = torch.randn(32, 16)
    h = net[:2](x)
    data, model = parallelism_splits(net, [net[:2], net[2:]], x, h)
    assert data.layers == ["Linear 16→256", "ReLU", "Linear 256→256", "ReLU", "Linear 256→1"]
    assert data.holds == [[True] * 5] * 2 and data.parameters == [70_401] * 2 and data.samples == [16, 16]
    assert data.message_bytes == 70_401 * 4
    assert model.holds == [[True, True, False, False, False], [False, False, True, True, True]]
    assert model.parameters == [4_352, 66_049] and model.samples == [32, 32]
    assert model.message_bytes == 32 * 256 * 4
    # A cut that is not a cut: a layer in two stages, or none.
    with pytest.raises(ValueError, match="consecutive"):
        parallelism_splits(net, [net[:3], net[2:]], x, h)
    with pytest.raises(ValueError, match="consecutive"):
        parallelism_splits(net, [net[:2], net[3:]], x, h)
    fig = splits_figure((data, model))
    left, right = fig.get_axes()
    # Per worker: its frame and a box per layer.
    assert [sum(isinstance(p, FancyBboxPatch) for p in ax.patches) for ax in (left, right)] == [12, 12]
    assert "gradients,\naveraged (all-reduce)\n281,604 bytes" in [t.get_text() for t in left.texts]
    alt = describe_splits((data, model))
    assert "worker 0 holds Linear 16→256, ReLU (4,352 parameters) and computes on 32 samples" in alt
    assert "32,768 bytes per step" in alt
