"""parallel_course.memory_figures (chapter 16): the figures' text alternatives, from the data the
figures draw."""

from parallel_course.flash_attention import tile_grid
from parallel_course.memory_figures import describe_peak_parts, describe_saved_bytes, describe_tiles


def test_describe_tiles_counts_each_kind_of_tile():
    grids = {f"causal={c}": tile_grid(37, 8, c) for c in (False, True)}
    text = describe_tiles(grids, 37, 8)
    # 5 x 5 tiles: all 25 whole without the mask; with it, 10 below the diagonal, 5 across, 10 above.
    assert "37 positions cut into 5 x 5 tiles of 8" in text
    assert "causal=False: 25 whole, 0 masked across the diagonal, 0 skipped" in text
    assert "causal=True: 10 whole, 5 masked across the diagonal, 10 skipped" in text


def test_describe_saved_bytes_says_how_each_curve_grows():
    text = describe_saved_bytes([64, 128, 256], [100, 400, 1600], [10, 20, 40])
    assert "from 64 to 256" in text
    assert "100 to 1,600 bytes, 16 times for 4 times the length" in text and "10 to 40 bytes, 4 times" in text


def test_describe_peak_parts_gives_each_layouts_total_and_its_parts_largest_first():
    peaks = {
        "single": {"parameters": 4000, "activations": 6000, "other": 0, "total": 10000},
        "fsdp": {"parameters": 2000, "activations": 6000, "total": 8000},
    }
    text = describe_peak_parts(peaks)
    assert "single 10 kB (activations 6, parameters 4)" in text
    assert "fsdp 8 kB (activations 6, parameters 2)" in text
