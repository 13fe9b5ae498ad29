"""``parallel_course.float8`` (17a) and the planner's FP8 roofline: the formats against their
specifications, scales and casts on hand examples, the census's counts, the recipe by hand, FSDP2's
all-gather bytes, the plots' data, and when FP8 pays, against numbers worked out by hand."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from parallel_course import float8, planner  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_the_formats_read_from_their_bits_match_their_specifications():
    """The FP8 paper's table (Micikevicius et al. 2022, Table 1) and IEEE's bfloat16."""
    e4m3, e5m2, bf16 = (float8.format_row(d) for d in (E4M3, E5M2, torch.bfloat16))
    assert (e4m3["exponent bits"], e4m3["mantissa bits"], e4m3["max"]) == (4, 3, 448)
    assert (e4m3["smallest normal"], e4m3["smallest subnormal"], e4m3["unit roundoff"]) == (2**-6, 2**-9, 2**-4)
    assert (e5m2["exponent bits"], e5m2["mantissa bits"], e5m2["max"]) == (5, 2, 57344)
    assert (e5m2["smallest normal"], e5m2["smallest subnormal"], e5m2["unit roundoff"]) == (2**-14, 2**-16, 2**-3)
    # e4m3fn: 256 patterns less its 2 NaNs, ±0 once; e5m2: less 2 infinities and 6 NaNs.
    assert (e4m3["finite values"], e5m2["finite values"]) == (253, 247)
    assert (bf16["unit roundoff"], bf16["finite values"]) == (2**-8, 2 * (2**15 - 2**7) - 1)
    values = float8.representable(E4M3)
    assert values[0] == 0 and values[1] == 2**-9 and values[-1] == 448 and len(values) == 127
    assert torch.all(values[1:] > values[:-1])
    with pytest.raises(ValueError, match="not an eight-bit format"):
        float8.representable(torch.bfloat16)


def test_the_relative_gap_is_at_most_2u_in_the_normal_range_and_1_at_the_smallest_subnormal():
    for dtype in (E4M3, E5M2):
        values, gaps = float8.relative_spacing(dtype)
        normal = gaps[values >= torch.finfo(dtype).smallest_normal]
        assert normal.max() == 2 * float8.unit_roundoff(dtype) and normal.min() > float8.unit_roundoff(dtype)
        assert gaps[0] == 1.0
    assert float8.rounding_error(torch.tensor([1.0625]), E4M3).item() == pytest.approx(0.0625 / 1.0625)


def test_scales_per_tensor_row_and_block():
    x = torch.tensor([[1.0, -2.0, 0.5, 4.0], [0.25, 0.125, -0.5, 0.0]])
    assert float8.scale_for(x, E4M3, "tensorwise").item() == pytest.approx(448 / 4)
    assert float8.scale_for(x, E4M3, "rowwise").flatten().tolist() == pytest.approx([448 / 4, 448 / 0.5])
    assert float8.scale_for(x, E4M3, "none").item() == 1.0
    # MX: a power of two per block, 2^(emax - floor(log2 amax)); emax 8 for e4m3, 15 for e5m2.
    blocks = torch.cat([torch.full((1, 32), 3.0), torch.full((1, 32), 0.3)], dim=1)
    scale = float8.scale_for(blocks, E4M3, "mx", block=32)
    assert scale.shape == blocks.shape
    assert scale[0, 0].item() == 2.0 ** (8 - 1) and scale[0, 40].item() == 2.0 ** (8 + 2)
    assert float8.scale_for(blocks, E5M2, "mx")[0, 0].item() == 2.0 ** (15 - 1)
    with pytest.raises(ValueError, match="multiple of the block"):
        float8.scale_for(torch.ones(2, 33), E4M3, "mx")
    with pytest.raises(ValueError, match="granularity"):
        float8.scale_for(x, E4M3, "columnwise")
    # A block whose amax has a large mantissa lands above 448 and saturates (the specification's floor).
    saturating = torch.full((1, 32), 1.9)
    assert float8.quantize(saturating, E4M3, "mx")[0, 0].item() == pytest.approx(448 / 2**8)


def test_the_census_counts_overflow_flushes_and_subnormals_by_hand():
    # e4m3 rounds up to 464 onto 448 (half its last gap of 32); 2^-11 flushes; 2^-7 is subnormal.
    x = torch.tensor([463.0, 465.0, 2**-11, 2**-7, 1.0, 0.0])
    assert float8.census(x, E4M3) == {"overflow": 1, "flushed": 1, "subnormal": 1, "total": 6}
    assert float8.census(x, E4M3, scale=2.0)["overflow"] == 2
    # e5m2: up to 61440 rounds onto 57344 (half its last gap of 8192).
    assert float8.census(torch.tensor([61000.0, 62000.0]), E5M2)["overflow"] == 1
    histogram = float8.log2_histogram(torch.tensor([1.0, 1.5, 2.0, 0.25, 0.0]))
    low = float8.LOG2_BINS[0]
    assert histogram.sum() == 4 and histogram[0 - low] == 2 and histogram[1 - low] == 1 and histogram[-2 - low] == 1


def test_cast_census_counts_every_operand_of_every_convertible_linear_and_removes_its_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    x = torch.randn(4, 16, requires_grad=True)
    with float8.CastCensus(model, history=2) as seen:
        for _ in range(3):
            model(x).sum().backward()
    # Only the first linear (the second's 3 outputs are not a multiple of 16), three steps.
    assert seen.counts[("activations", "dynamic")]["total"] == 3 * 4 * 16
    assert seen.counts[("weights", "unscaled")]["total"] == 3 * 32 * 16
    assert seen.counts[("gradients", "delayed")]["total"] == 3 * 4 * 32
    assert len(seen.amaxes) == 3 and all(len(a) == 3 for a in seen.amaxes.values())
    assert seen.histograms["weights"].sum() == 3 * 32 * 16
    assert not model[0]._forward_pre_hooks and not model[0]._backward_hooks


def test_a_delayed_scale_clips_a_tensor_whose_amax_grew():
    model = nn.Linear(16, 16, bias=False)
    seen = float8.CastCensus(model, history=1)
    seen.record("x", "activations", torch.ones(4, 16))
    seen.record("x", "activations", 4 * torch.ones(4, 16))
    assert seen.counts[("activations", "delayed")]["overflow"] == 64
    assert seen.counts[("activations", "dynamic")]["overflow"] == 0


def test_the_recipe_by_hand_casts_each_operand_and_swaps_only_what_the_filter_passes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 12))
    assert float8.by_hand(model) == 1 and float8.converted_linears(model) == ["0"]
    layer = model[0]
    x = torch.randn(5, 16, requires_grad=True)
    y = layer(x)
    expected = float8.quantize(x.detach(), E4M3) @ float8.quantize(layer.weight.detach(), E4M3).t() + layer.bias
    assert torch.equal(y, expected)
    g = torch.randn_like(y)
    y.backward(g)
    g8 = float8.quantize(g, E5M2)
    assert torch.equal(x.grad, g8 @ float8.quantize(layer.weight.detach(), E4M3))
    assert torch.equal(layer.weight.grad, g8.t() @ float8.quantize(x.detach(), E4M3))
    unscaled = nn.Sequential(nn.Linear(16, 16))
    float8.by_hand(unscaled, granularity="none")
    tiny = torch.full((2, 16), 2.0**-12)
    # Unscaled, e4m3 flushes 2^-12 (below half its smallest subnormal): the output is the bias alone.
    assert torch.equal(unscaled(tiny), unscaled[0].bias.expand(2, 16))


def test_fsdp_gather_bytes_by_hand():
    params = {"w": torch.zeros(5, 3), "b": torch.zeros(5), "s": torch.zeros(())}
    # dim 0 of 5 over 2 ranks pads to 3 rows: 9 + 3 + 1 elements.
    assert float8.fsdp_gather_bytes(params, 2) == (9 + 3 + 1) * 4
    assert float8.fsdp_gather_bytes(params, 2, {"w"}) == 9 + (3 + 1) * 4
    assert float8.fsdp_gather_bytes(params, 1, element_size=2) == (15 + 5 + 1) * 2


def test_plain_storage_unwraps_what_wraps_a_parameter():
    t = torch.arange(4.0)

    class Wrapper:
        _tensor = t

    class Local:
        def to_local(self):
            return Wrapper()

    assert float8.plain_storage(Local()).data_ptr() == t.untyped_storage().data_ptr()
    assert float8.plain_storage(t).data_ptr() == t.untyped_storage().data_ptr()
    # torchao's float8 tensor (what FSDP2 gathers in FP8, what an FP8 linear saves): its own storage
    # cannot be read; its eight-bit data's can.
    float8.import_torchao()
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    cast = hp_tensor_and_scale_to_float8(t, torch.tensor(2.0), E4M3)
    with pytest.raises(RuntimeError):
        cast.untyped_storage().data_ptr()
    assert float8.plain_storage(cast).data_ptr() == cast._data.untyped_storage().data_ptr()
    assert float8.plain_storage(cast).nbytes() == 4


def test_the_chapters_training_is_the_same_every_time_and_blind_to_the_loss_scale():
    first = float8.train(float8.capstone(), 2)
    assert float8.train(float8.capstone(), 2) == first
    scaled = float8.train(float8.capstone(), 2, loss_scale=2.0**-20)
    assert scaled == pytest.approx(first, rel=1e-5)
    assert float8.emulate_here(torch.device("cpu"))


def test_the_plots_draw_their_data_where_they_say():
    fig, ax = plt.subplots()
    float8.plot_grid(ax, {"e4m3": E4M3})
    values, gaps = float8.relative_spacing(E4M3)
    assert ax.lines[0].get_xdata().tolist() == values.tolist() and ax.lines[0].get_ydata().tolist() == gaps.tolist()
    assert ax.get_xscale() == "log"
    fig, axes = plt.subplots(1, 2)
    histograms = {"activations": torch.arange(64), "gradients": torch.ones(64, dtype=torch.long)}
    windows = {"activations": ("e4m3", E4M3), "gradients": ("e5m2", E5M2)}
    float8.plot_census(axes, histograms, windows)
    bars = axes[0].patches[:64]
    assert [b.get_height() for b in bars] == list(range(64)) and bars[0].get_x() == float8.LOG2_BINS[0]
    span = axes[1].patches[-1]
    assert span.get_x() == pytest.approx(-14) and span.get_x() + span.get_width() == pytest.approx(math.log2(57344))
    fig, ax = plt.subplots()
    float8.plot_deviation(ax, {"a": [1e-3, 2e-3], "b": [0.0, 1e-4]}, tolerance=5e-3)
    assert ax.lines[0].get_ydata().tolist() == [1e-3, 2e-3] and ax.lines[1].get_ydata().tolist() == [1e-9, 1e-4]
    assert list(ax.lines[2].get_ydata()) == [5e-3, 5e-3]
    plt.close("all")


# --- the planner: when FP8 pays (torchao's roofline) -------------------------------------------


def test_float8_linear_times_by_hand():
    gpu = planner.Roofline(
        "test", bf16_flops=1e15, fp8_flops=2e15, memory_bandwidth=1e12, matmul_efficiency=1.0, memory_efficiency=1.0
    )
    m = k = n = 8192
    t = planner.float8_linear_times(m, k, n, gpu)
    # Three matmuls of 2 m k n FLOPs each, compute-bound at these sizes.
    assert t["bf16"] == pytest.approx(3 * 2 * m * k * n / 1e15)
    assert t["fp8_matmuls"] == pytest.approx(3 * 2 * m * k * n / 2e15)
    # Casts: input 2 + 4, weight 2 + 3 + 3, gradient 2 + 4 bytes an element, plus three reduction
    # kernels of no bytes at the launch cost each.
    casts = ((2 + 4) * m * k + (2 + 3 + 3) * k * n + (2 + 4) * m * n) / 1e12 + 3 * planner.KERNEL_LAUNCH_S
    assert t["casts"] == pytest.approx(casts)
    fused = planner.float8_linear_times(m, k, n, gpu, fused_casts=True)
    # Fused, the amax kernels of the input and the gradient read nothing: a launch each.
    assert fused["casts"] == pytest.approx(casts - 2 * (m * k + m * n) / 1e12 + 2 * planner.KERNEL_LAUNCH_S)
    # A tiny matmul costs a launch whatever its dtype.
    tiny = planner.float8_linear_times(16, 16, 16, gpu)
    assert tiny["bf16"] == tiny["fp8_matmuls"] == 3 * planner.KERNEL_LAUNCH_S


def test_fp8_pays_for_large_matrices_only():
    h100 = planner.ROOFLINES["h100"]
    speedups = [planner.float8_speedup(s, s, s, h100, True) for s in (256, 1024, 4096, 16384, 65536)]
    assert speedups[0] < 1 < speedups[2] and speedups == sorted(speedups) and speedups[-1] < 2
    assert planner.float8_speedup(4096, 4096, 4096, h100, True) > planner.float8_speedup(4096, 4096, 4096, h100)
    llama = planner.model("llama3-8b")
    assert [name for name, _, _ in planner.linear_shapes(llama)] == ["q", "k", "v", "proj", "w1", "w3", "w2"]
    assert planner.linear_shapes(llama)[1] == ("k", 4096, 1024)
    assert all(s > 1 for _, s in planner.float8_linears(llama, 8192, h100, fused_casts=True))


def test_describe_grid_reads_each_formats_values_and_gaps():
    text = float8.describe_grid({"e4m3": E4M3, "e5m2": E5M2}, torch.bfloat16)
    # e4m3fn: 126 positive finite values from 2^-9 to 448, normal gap 2^-3; e5m2: 123 up to 57344, 2^-2;
    # both gaps reach 1 at the smallest subnormal; bfloat16's largest gap is 2^-7.
    assert "e4m3: 126 positive values from 0.00195 to 448, the gap flat at 0.125" in text
    assert "e5m2: 123 positive values from 1.53e-05 to 5.73e+04, the gap flat at 0.25" in text
    assert text.count("rising to 1 at the smallest subnormal") == 2
    assert "A dotted line marks bfloat16's largest gap, 0.00781." in text


def test_describe_census_counts_the_share_inside_each_window():
    low, high = float8.LOG2_BINS
    counts = torch.zeros(high - low, dtype=torch.long)
    # Three values at 2^-20 (below e4m3's normal range, 2^-6 up) and one at 2^0 (inside).
    counts[-20 - low], counts[0 - low] = 3, 1
    text = float8.describe_census({"weights": counts}, {"weights": ("e4m3 range", E4M3)})
    assert "weights: |x| from 2^-20 to 2^1, 25% of them inside the e4m3 range" in text


def test_describe_deviation_says_which_runs_stay_within_the_tolerance():
    text = float8.describe_deviation({"a": [0.0, 0.001], "b": [0.02, 0.3]}, 0.01)
    assert "over 2 steps" in text and "tolerance 0.01" in text
    assert "a at most 0.001 (within it)" in text and "b at most 0.3 (beyond it)" in text


def test_describe_float8_speedups_finds_where_fp8_starts_to_pay():
    sides = [2**k for k in range(7, 16)]
    h100 = planner.ROOFLINES["h100"]
    curve = [planner.float8_speedup(s, s, s, h100, True) for s in sides]
    text = planner.describe_float8_speedups(sides, {"h100, fused": curve, "never": [0.5] * len(sides)})
    first = next(s for s, x in zip(sides, curve) if x > 1)
    assert f"h100, fused: {curve[0]:.2f} at N = 128, above 1 from N = {first}, {curve[-1]:.2f} at N = 32768" in text
    assert "never: 0.50 at N = 128, below 1 throughout" in text


def test_describe_census_says_when_the_end_bins_hold_what_lies_beyond():
    low, high = float8.LOG2_BINS
    counts = float8.log2_histogram(torch.tensor([2.0**-60, 2.0**20]))
    text = float8.describe_census({"gradients": counts}, {"gradients": ("e5m2 range", E5M2)})
    # The top bin, [2^15, 2^16), counts as inside e5m2's range (to 57344), as the figure shades it.
    assert f"|x| from 2^{low} or less to 2^{high} or more, 50% of them inside" in text
