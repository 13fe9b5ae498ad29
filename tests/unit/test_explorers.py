"""The explorers (parallel_course.explorers): each follows its controls, shows its text and figure
from the start, and keeps a short repr (what a notebook stores). tests/browser/test_jupyterlab.py drives
each one in a real browser."""

import pytest

from parallel_course import costmodel as cm
from parallel_course.explorers import (
    cost_model_explorer,
    layout_memory_explorer,
    pipeline_explorer,
    placement_explorer,
    ring_allreduce_explorer,
    zero_calculator,
)
from parallel_course.explorers.base import Explorer
from parallel_course.explorers.cost_model import GBIT
from parallel_course.explorers.layout_memory import settings_text
from parallel_course.explorers.zero import draw, summary

EXPLORERS = [
    cost_model_explorer,
    layout_memory_explorer,
    pipeline_explorer,
    placement_explorer,
    ring_allreduce_explorer,
    zero_calculator,
]


@pytest.mark.parametrize("make", EXPLORERS, ids=[f.__name__ for f in EXPLORERS])
def test_every_explorer_is_the_one_pattern(make):
    e = make()
    assert isinstance(e, Explorer) and e.result.value
    assert e.plot is None or bytes(e.plot.value).startswith(b"\x89PNG")  # there before any control moves
    assert len(repr(e)) <= 110  # ipywidgets cuts longer text reprs
    assert list(e.children[: len(e.controls)]) == list(e.controls.values())


def test_placement_explorer_follows_its_sliders():
    w = placement_explorer(num_gpus=0, world_size=2)
    assert "rank 1: cpu (gloo)" in w.result.value
    w.controls["num_gpus"].value = 4
    assert "rank 1: cuda:1 (nccl)" in w.result.value


def test_cost_model_explorer_shows_the_model_prediction():
    e = cost_model_explorer(
        world_size=4, compute_ms=500, model_mb=100, bandwidth_gbit=8, latency_us=0, overlap=0.0, algorithm="ring"
    )
    p = cm.predict(4, compute_s=0.5, model_bytes=100e6, bandwidth=8 * GBIT)  # 8 Gbit/s = 1 GB/s
    assert e.prediction() == p
    assert "predicted step            650.0 ms" in e.summary()
    e.controls["algorithm"].value = "ps"  # the view follows the controls
    assert "the server receives" in e.result.value


def test_ring_explorer_follows_its_sliders():
    w = ring_allreduce_explorer(world_size=3)
    step = w.controls["step"]
    assert step.max == 4 and "step 0 of 4" in w.result.value
    step.value = 4
    assert "at the end: 4/3 S per rank" in w.result.value
    assert "sent so far per rank, in units of S: 4/3" in w.result.value
    w.controls["world_size"].value = 5
    assert step.max == 8
    w.controls["naive"].value = True
    assert step.max == 4 and "at the end: 4 S per rank" in w.result.value
    assert repr(w).startswith("RingExplorer(naive, N=5")


def test_pipeline_explorer_follows_its_sliders():
    pipe = pipeline_explorer(n_stages=2, n_microbatches=2)
    before = pipe.result.value
    pipe.controls["n_microbatches"].value = 6
    assert pipe.result.value != before and "m = 6" in pipe.result.value


def test_zero_calculator_summary_figure_and_controls():
    text = summary(7.5, 64, "mixed", 80)
    assert "120.00 GB" in text and "1.88 GB" in text
    assert len(draw(1.5, 8, "fp32", 40).axes) == 2
    ui = zero_calculator()
    assert [c.description for c in ui.children[:4]] == [
        "parameters (billions)",
        "ranks N",
        "precision",
        "device memory (GB)",
    ]
    assert "120.00 GB" in ui.result.value
    before = (ui.result.value, ui.plot.value)
    ranks = ui.controls["world_size"]
    ranks.value = ranks.options[0]
    assert ui.values["world_size"] == ranks.options[0]
    assert ui.result.value != before[0] and ui.plot.value != before[1]


def test_layout_memory_explorer_follows_its_controls_and_keeps_t_a_divisor_of_n():
    ui = layout_memory_explorer()
    assert [c.description for c in ui.children[:6]] == [
        "model",
        "processes N",
        "tensor parallel t",
        "sequence length",
        "micro-batch b",
        "checkpoint every block",
    ]
    assert "tp+sp" in ui.result.value and "GPT-3 6.7B" in ui.result.value
    before = (ui.result.value, ui.plot.value)
    ui.controls["seq_len"].value = 4096
    assert ui.result.value != before[0] and ui.plot.value != before[1] and "sequence 4096" in ui.result.value
    ui.controls["world_size"].value = 2  # below t = 8: t follows
    assert ui.values["tp"] == 2 and "N = 2, t = 2" in ui.result.value
    ui.controls["checkpointing"].value = True
    assert "every block checkpointed" in ui.result.value


def test_layout_memory_explorer_knows_cp_and_experts_and_keeps_their_degrees_divisors():
    dense = layout_memory_explorer()
    assert [c.description for c in dense.children[6:11]] == [
        "context parallel cp",
        "experts E",
        "top-k",
        "capacity factor C",
        "expert parallel ep",
    ]
    assert dense.controls["ep"].disabled  # dense by default, and the repr of before
    assert repr(dense) == "LayoutMemoryExplorer(N=64, t=8, s=2048, b=4, checkpointing=False)"
    ui = layout_memory_explorer(cp=4, experts=64, ep=8)
    assert ui.result.value != dense.result.value and ui.plot.value != dense.plot.value
    assert "cp = 4, ep = 8" in ui.result.value and "64 experts per block, top-2" in ui.result.value
    assert not ui.controls["ep"].disabled
    ui.controls["world_size"].value = 16  # N/t = 2 data ranks: cp and ep follow
    assert (ui.values["cp"], ui.values["ep"]) == (2, 2)
    ui.controls["experts"].value = 0  # dense: no expert parallelism
    assert ui.values["ep"] == 1 and ui.controls["ep"].disabled
    widest = dict(world_size=1024, tp=8, seq_len=131072, micro_batch=16, checkpointing=False, cp=32)
    assert len(settings_text(widest | dict(experts=128, ep=32, top_k=4, capacity_factor=1.25))) <= 110


def test_planner_explorer_follows_its_controls_and_says_why_a_layout_fails():
    # Imported here: this test is appended after the module's list of explorers.
    from parallel_course import planner as P
    from parallel_course.explorers import planner_explorer
    from parallel_course.explorers.planner import plan_of

    ui = planner_explorer()
    assert [c.description for c in ui.children[:5]] == [
        "model",
        "cluster",
        "nodes (8 GPUs)",
        "global batch",
        "tensor parallel tp",
    ]
    # The one pattern (test_every_explorer_is_the_one_pattern): text and figure from the start.
    assert isinstance(ui, Explorer) and ui.result.value and bytes(ui.plot.value).startswith(b"\x89PNG")
    assert len(repr(ui)) <= 110 and list(ui.children[: len(ui.controls)]) == list(ui.controls.values())
    assert ui.summary() == plan_of(**ui.values).summary() and "dp=16 tp=4" in ui.result.value
    before = (ui.result.value, ui.plot.value)
    ui.controls["tp"].value = 2  # what the browser test does: tp one step down, dp follows
    assert ui.result.value != before[0] and ui.plot.value != before[1] and "dp=32 tp=2" in ui.result.value
    ui.controls["zero"].value = 0
    ui.controls["tp"].value = 1  # 6.9 B parameters of plain DDP: 16 bytes each do not fit
    assert "rejected: needs" in ui.result.value and "GB per GPU" in ui.result.value
    ui.controls["nodes"].value = 1
    ui.controls["pp"].value = 16  # more stages than GPUs, and than the 32 layers allow
    assert "cannot run" in ui.result.value and "the cluster has 8" in ui.result.value
    assert P.plan(P.model("gpt3-6.7b"), P.cluster("a100-80gb", 1), P.Layout(1, pp=16), 512).problems[0] in ui.summary()
