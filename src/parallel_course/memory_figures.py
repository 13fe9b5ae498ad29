"""Chapter 16's figures, drawn from its own computation: FlashAttention's tiles, the bytes attention
saves for backward against the sequence length, and what torch's tracker saw at each layout's peak.
Each takes an Axes and the data; nothing here computes a figure's numbers."""

from __future__ import annotations

from matplotlib.patches import Polygon, Rectangle

# The colour of each kind of tile (flash_attention.tile_kind); a skipped tile is not drawn.
TILE_COLOURS = {"full": "tab:blue", "causal": "tab:orange"}
# The order and colour of each part of a tracked peak (memory_tracking.PART_NAMES).
PART_COLOURS = {
    "parameters": "tab:blue",
    "gradients": "tab:orange",
    "optimizer": "tab:green",
    "activations": "tab:red",
    "temporaries": "tab:purple",
    "other": "tab:gray",
}


def plot_tiles(ax, grid: list[list[str]], seq_len: int, block_size: int) -> None:
    """The query x key square cut into tiles of block_size (grid: flash_attention.tile_grid): a full
    tile filled, a tile the diagonal crosses filled only below it (the keys each query sees), a
    skipped one left blank; queries down, keys across."""
    for i, row in enumerate(grid):
        for j, kind in enumerate(row):
            if kind == "skip":
                continue
            q0, k0 = i * block_size, j * block_size
            q1, k1 = min(q0 + block_size, seq_len), min(k0 + block_size, seq_len)
            if kind == "full":
                ax.add_patch(Rectangle((k0, q0), k1 - k0, q1 - q0, color=TILE_COLOURS[kind], alpha=0.6))
            else:
                # On the diagonal (k0 == q0): the keys at or before each query, a triangle.
                ax.add_patch(Polygon([(k0, q0), (k0, q1), (k1, q1)], color=TILE_COLOURS[kind], alpha=0.6))
            ax.add_patch(Rectangle((k0, q0), k1 - k0, q1 - q0, fill=False, edgecolor="black", linewidth=0.8))
    ax.set(xlim=(0, seq_len), ylim=(seq_len, 0), xlabel="key position", ylabel="query position", aspect="equal")
    computed = sum(kind != "skip" for row in grid for kind in row)
    ax.set_title(f"{seq_len} positions, tiles of {block_size}: {computed} of {len(grid) ** 2} computed", fontsize=9)


def plot_saved_bytes(ax, lengths: list[int], naive: list[int], flash: list[int]) -> None:
    """Bytes saved for backward (beyond q, k, v) against the sequence length, both axes logarithmic:
    naive attention (its probabilities, s x s per head) and FlashAttention (output and log-sum-exp)."""
    ax.loglog(lengths, naive, "o-", label="naive: probabilities, s × s")
    ax.loglog(lengths, flash, "s-", label="FlashAttention: output + log-sum-exp")
    ax.set(xlabel="sequence length s", ylabel="bytes saved for backward\n(beyond q, k, v)")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.legend(fontsize=8)


def plot_peak_parts(ax, peaks: dict[str, dict[str, int]]) -> None:
    """One stacked bar per layout (peaks: layout -> memory_tracking.by_part of its tracked peak), a
    segment per part, in kB."""
    names = list(peaks)
    bottoms = [0.0] * len(names)
    for part, colour in PART_COLOURS.items():
        heights = [peaks[name].get(part, 0) / 1e3 for name in names]
        ax.bar(names, heights, bottom=bottoms, color=colour, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set(ylabel="kB on rank 0 at the peak", title="What the tracker saw at each layout's peak")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def describe_tiles(grids: dict[str, list[list[str]]], seq_len: int, block_size: int) -> str:
    """The text alternative of ``plot_tiles``' panels (grids: panel label -> its tile grid): how many
    tiles each computes whole, masked across the diagonal, and skips."""
    parts = []
    for label, grid in grids.items():
        kinds = [kind for row in grid for kind in row]
        parts.append(
            f"{label}: {kinds.count('full')} whole, {kinds.count('causal')} masked across the diagonal, "
            f"{kinds.count('skip')} skipped"
        )
    n = len(next(iter(grids.values())))
    return (
        f"The query x key square of {seq_len} positions cut into {n} x {n} tiles of {block_size}, "
        "queries down, keys across. " + "; ".join(parts) + "."
    )


def describe_saved_bytes(lengths: list[int], naive: list[int], flash: list[int]) -> str:
    """The text alternative of ``plot_saved_bytes``: both curves' ends and how each grows."""
    growth = lengths[-1] / lengths[0]
    return (
        f"Bytes saved for backward beyond q, k, v against the sequence length s from {lengths[0]} to "
        f"{lengths[-1]} (log-log). Naive attention: {naive[0]:,} to {naive[-1]:,} bytes, "
        f"{naive[-1] / naive[0]:.0f} times for {growth:.0f} times the length; FlashAttention: {flash[0]:,} to "
        f"{flash[-1]:,} bytes, {flash[-1] / flash[0]:.0f} times."
    )


def describe_peak_parts(peaks: dict[str, dict[str, int]]) -> str:
    """The text alternative of ``plot_peak_parts``: each layout's peak in kB and its parts, largest first."""
    parts = []
    for name, peak in peaks.items():
        shown = sorted((part for part in PART_COLOURS if peak.get(part, 0)), key=lambda p: -peak[p])
        total = peak.get("total", sum(peak.get(part, 0) for part in PART_COLOURS))
        parts.append(f"{name} {total / 1e3:.0f} kB (" + ", ".join(f"{p} {peak[p] / 1e3:.0f}" for p in shown) + ")")
    return "Stacked bars, kB on rank 0 at each layout's tracked peak, by part: " + "; ".join(parts) + "."
