"""``parallel_course.compiled`` (17b): the compile counter's graphs, recompiles and graph breaks on
small functions, the collectives counter in a gloo group of one (c10d's and the functional ones,
waits left out), per-block compilation, and the plots' data."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.nn as nn  # noqa: E402

from parallel_course import compat, compiled  # noqa: E402


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_the_counter_sees_graphs_recompiles_and_graph_breaks():
    compiled.reset()
    counter = compiled.CompileCounter("eager")

    def smooth(x):
        return (x * 2).relu().sum()

    f = torch.compile(smooth, backend=counter)
    f(torch.ones(3))
    f(torch.ones(3))
    assert (counter.graphs, counter.recompiles, compiled.graph_breaks()) == (1, 0, {})
    # A new shape fails the guards: compiled again (then with a dynamic size).
    f(torch.ones(5))
    f(torch.ones(7))
    assert (counter.graphs, counter.recompiles) == (2, 1)

    def branchy(x):
        if x.sum() > 0:
            x = x + 1
        return x * 3

    compiled.reset()
    counter = compiled.CompileCounter("eager")
    torch.compile(branchy, backend=counter)(torch.ones(3))
    breaks = compiled.graph_breaks()
    assert counter.graphs == 2 and sum(breaks.values()) == 1
    assert "branching" in next(iter(breaks)).lower()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x).relu() + x


def test_compile_blocks_compiles_each_block_in_place():
    compiled.reset()
    counter = compiled.CompileCounter("eager")
    model = nn.Module()
    model.blocks = nn.ModuleList(Block() for _ in range(3))
    assert compiled.compile_blocks(model, counter) == 3
    # Every block's input needs gradients, as in a model (else the first block's guards fail on the second).
    x = torch.ones(2, 4, requires_grad=True)
    for block in model.blocks:
        x = block(x)
    # One graph for the three blocks: the same code, their weights as inputs.
    assert counter.graphs == 1 and counter.recompiles == 0


def test_collectives_are_counted_by_name_and_waits_are_not(group):
    t = torch.ones(4)
    with compiled.Collectives() as seen:
        dist.all_reduce(t)
        funcol.all_reduce(t, "sum", group).wait()
        out = torch.empty(4)
        compat.all_gather_single(out, t)
        (t * 2).sum()
    assert dict(seen.counts) == {"allreduce": 1, "all_reduce": 1, "allgather_base": 1}


def test_plots_draw_the_counts_and_the_times():
    fig, ax = plt.subplots()
    compiled.plot_collectives(ax, {"eager": {"all_reduce": 12}, "compiled": {"all_reduce": 12, "allgather_base": 5}})
    heights = [p.get_height() for p in ax.patches]
    # Bars per name (sorted), one per run: all_reduce 12, 12; allgather_base 0, 5.
    assert heights == [12, 12, 0, 5]
    fig, ax = plt.subplots()
    compiled.plot_step_times(ax, {"a": [3.0, 0.1, 0.1]})
    assert list(ax.lines[0].get_ydata()) == [3.0, 0.1, 0.1] and ax.get_yscale() == "log"
    plt.close("all")


def test_describe_collectives_and_step_times():
    counts = {"fsdp\neager": {"allgather_base": 5, "reduce_scatter_base": 3}}
    text = compiled.describe_collectives(counts)
    assert "fsdp, eager: 5 allgather_base, 3 reduce_scatter_base" in text
    alt, plain = compiled.describe_step_times({"eager": [0.5, 0.25], "compiled": [12.0, 0.125]})
    assert "eager: 0.5, 0.25; compiled: 12, 0.125" in alt and "2 steps" in alt
    # The plain text (what nbval compares) names the runs but holds none of this machine's times.
    assert "eager; compiled" in plain and "0.5" not in plain and "12" not in plain
