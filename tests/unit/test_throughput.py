"""parallel_course.throughput: the matrix-product peak as chapter 06a measures it, and the MFU of a
run from its step times (PaLM's definition, Chowdhery et al. 2022, section 4.1), on hand-computed
cases; the log line writes every rate as a time, which the notebooks' sanitizer replaces."""

import re
from pathlib import Path

import pytest
import torch

from parallel_course import throughput as tp

SANITIZE = Path(__file__).resolve().parents[1] / "sanitize.cfg"


def test_the_peak_is_the_fastest_product_and_leaves_the_random_state_alone():
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    peak = tp.measure_matmul_peak(n=64, repeats=5)
    assert torch.rand(1) == before
    assert (peak.n, peak.repeats, peak.threads) == (64, 5, torch.get_num_threads())
    assert peak.flops == 2 * 64**3
    assert peak.best_s > 0 and peak.flops_per_s == peak.flops / peak.best_s


def test_a_bad_peak_request_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        tp.measure_matmul_peak(n=0)


def test_median_step_skips_the_first():
    assert tp.median_step_s([9.0, 1.0, 3.0, 2.0]) == 2.0
    assert tp.median_step_s([9.0, 1.0, 3.0, 2.0], skip=0) == 2.5
    with pytest.raises(ValueError, match="train more steps"):
        tp.median_step_s([9.0])


def test_mfu_by_hand():
    # 1000 FLOPs per token, 50 tokens per step, 0.5 s a step: 100,000 FLOP/s; against 400,000: 0.25.
    assert tp.achieved_flops_per_s(1000, 50, 0.5) == 1e5
    assert tp.mfu(1e5, 4e5) == 0.25
    with pytest.raises(ValueError):
        tp.achieved_flops_per_s(1000, 50, 0)
    with pytest.raises(ValueError):
        tp.mfu(1e5, 0)


def test_summary_of_a_run():
    figures = tp.summary(50, [3.0, 0.5, 0.4, 0.6], 1000.0, [2e5, 2e5])
    assert figures["median_step_s"] == 0.5 and figures["steps_timed"] == 3
    assert figures["tokens_per_s"] == 100 and figures["model_flops_per_s"] == 1e5
    assert figures["peak_flops_per_s"] == 4e5 and figures["mfu"] == 0.25
    # Without peaks: no MFU. One step: timed by itself.
    alone = tp.summary(50, [0.5], 1000.0)
    assert "mfu" not in alone and alone["median_step_s"] == 0.5 and alone["steps_timed"] == 1


def sanitize(text: str) -> str:
    """The notebooks' sanitizers (tests/sanitize.cfg) applied to text, as nbval applies them."""
    pairs = re.findall(r"^regex: (.*)\nreplace: ?(.*)$", SANITIZE.read_text(), flags=re.M)
    for pattern, replacement in pairs:
        text = re.sub(pattern, replacement, text)
    return text


def test_the_line_differs_between_runs_only_where_the_sanitizer_replaces():
    one = tp.describe(tp.summary(128, [1.0, 0.0153, 0.0160], 606720.0, [7.77e10]))
    other = tp.describe(tp.summary(128, [2.0, 0.0201, 0.0190], 606720.0, [6.37e10]))
    assert one != other and sanitize(one) == sanitize(other)
    assert "128 tokens per step" in one and "0.607 MFLOP per token" in one and "(2 timed, after the first)" in one
    assert "matmul peak of 1 process" in one and sanitize(one).endswith("MFU RATIO")
    assert "of 2 processes together" in tp.describe(tp.summary(128, [1.0, 0.02], 606720.0, [1e10, 1e10]))
    # 128 tokens x 606,720 FLOPs = 7.766e7 FLOPs in 15.7 ms: 4.95e9 FLOP/s, 202.16 ms per GFLOP.
    assert "202.16 ms per GFLOP" in tp.describe(tp.summary(128, [1.0, 0.0157], 606720.0))
    assert tp.ms_per_gflop(1e9) == 1000.0
