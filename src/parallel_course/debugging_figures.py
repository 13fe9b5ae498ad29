"""Chapter 14b's figures, drawn from the flight records its hung jobs wrote: a row per rank, a
column per collective sequence number, each cell the call that rank entered there (read by
``debugging.collectives``, as the chapter's diagnosis reads them). Where every rank entered the same
call the column agrees; where one rank entered nothing it is behind; where they entered different
calls they disagree.

``flight_grid`` turns the records into what is drawn where; ``draw_flight_grid`` only places it on
Axes."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .debugging import Collective, collectives

COLOURS = {"agree": "#b5e48c", "missing": "white", "behind": "#ffd6a5", "mismatch": "#f4a3a3"}
VERDICTS = {
    "agree": "every rank entered the same call",
    "behind": "some rank never entered it",
    "mismatch": "the ranks entered different calls",
}


@dataclass
class FlightGrid:
    """``cells[rank][i]``: the call rank entered at ``seqs[i]`` (None: never entered);
    ``verdicts[i]``: "agree", "behind" (some rank missing) or "mismatch" (different calls)."""

    ranks: list[int]
    seqs: list[int]
    cells: list[list[Collective | None]]
    verdicts: list[str]


def flight_grid(records: dict[int, dict], last: int = 8) -> FlightGrid:
    """The last ``last`` sequence numbers any rank entered, each rank's call at each, and the
    verdict of each column."""
    by_rank = {rank: {c.seq: c for c in collectives(r)} for rank, r in records.items()}
    seqs = sorted(set().union(*by_rank.values()))[-last:]
    ranks = sorted(by_rank)
    cells = [[by_rank[rank].get(seq) for seq in seqs] for rank in ranks]
    verdicts = []
    for i in range(len(seqs)):
        here = [row[i] for row in cells]
        if len({(c.op, c.input_sizes) for c in here if c is not None}) > 1:
            verdicts.append("mismatch")
        elif any(c is None for c in here):
            verdicts.append("behind")
        else:
            verdicts.append("agree")
    return FlightGrid(ranks, seqs, cells, verdicts)


def _sizes(c: Collective) -> str:
    return ", ".join("x".join(map(str, s)) or "scalar" for s in c.input_sizes)


def draw_flight_grid(ax, grid: FlightGrid) -> None:
    """A row per rank, a column per sequence number: the call entered, coloured by its column's
    verdict; a cell a rank never reached is dashed and says so."""
    n = len(grid.ranks)
    for r, (rank, row) in enumerate(zip(grid.ranks, grid.cells)):
        y = n - 1 - r
        ax.text(-0.1, y + 0.4, f"rank {rank}", ha="right", va="center", fontsize=15)
        for i, (c, verdict) in enumerate(zip(row, grid.verdicts)):
            if c is None:
                ax.add_patch(
                    Rectangle(
                        (i * 1.6 + 0.05, y),
                        1.5,
                        0.8,
                        facecolor="white",
                        edgecolor="#c1121f",
                        linestyle="--",
                        linewidth=1.5,
                    )
                )
                ax.text(
                    i * 1.6 + 0.8, y + 0.4, "never\nentered", ha="center", va="center", fontsize=13, color="#c1121f"
                )
                continue
            ax.add_patch(
                Rectangle((i * 1.6 + 0.05, y), 1.5, 0.8, facecolor=COLOURS[verdict], edgecolor="black", linewidth=0.8)
            )
            ax.text(i * 1.6 + 0.8, y + 0.4, f"{c.op}\n({_sizes(c)})", ha="center", va="center", fontsize=13)
    for i, seq in enumerate(grid.seqs):
        ax.text(i * 1.6 + 0.8, n + 0.05, f"#{seq}", ha="center", va="bottom", fontsize=15)
    ax.text(
        len(grid.seqs) * 0.8,
        n + 0.45,
        "collective sequence number (oldest to newest)",
        ha="center",
        va="bottom",
        fontsize=12,
        color="0.3",
    )
    ax.set(xlim=(-1.1, len(grid.seqs) * 1.6 + 0.1), ylim=(-0.15, n + 0.9))
    ax.axis("off")


def flight_figure(grid: FlightGrid, title: str) -> Figure:
    fig = Figure(figsize=(max(6.5, 1.75 * len(grid.seqs) + 1.6), 1.05 * len(grid.ranks) + 2.2), layout="constrained")
    fig.suptitle(title, fontsize=14)
    draw_flight_grid(fig.add_subplot(), grid)
    shown = [v for v in VERDICTS if v in grid.verdicts]
    handles = [Patch(facecolor=COLOURS[v], edgecolor="black", label=VERDICTS[v]) for v in shown]
    if any(c is None for row in grid.cells for c in row):
        handles.append(Patch(facecolor="white", edgecolor="#c1121f", linestyle="--", label="never entered"))
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=13, frameon=False)
    return fig


def describe_flight_grid(grid: FlightGrid) -> str:
    """The figure's text alternative: per sequence number, each rank's call and the verdict."""
    parts = []
    for i, seq in enumerate(grid.seqs):
        calls = ", ".join(
            f"rank {rank} {c.call if c else 'never entered it'}"
            for rank, c in zip(grid.ranks, (row[i] for row in grid.cells))
        )
        parts.append(f"#{seq}: {calls} ({VERDICTS[grid.verdicts[i]]}).")
    return (
        f"Flight records of {len(grid.ranks)} ranks, collectives {grid.seqs[0]} to {grid.seqs[-1]} by sequence number. "
        + " ".join(parts)
    )


def describe_step_split(medians: list[dict[str, float]], slow: list[int]) -> tuple[str, str]:
    """The text alternative of the bars of each rank's median step, outside the collectives and inside
    them (medians: debugging.stragglers'), with the times; and a plain text without them (they differ
    from run to run; nbval compares the plain text). ``slow``: the ranks found to straggle."""
    head = f"Each of {len(medians)} ranks' median seconds per step, a bar split into outside the collectives and inside"
    found = f"the straggler found, most time outside: {', '.join(f'rank {r}' for r in slow) or 'none'}"
    bars = "; ".join(f"rank {r}: outside {m['outside']:.3f}, inside {m['inside']:.3f}" for r, m in enumerate(medians))
    return f"{head} (waiting): {bars}; {found}.", f"{head} (waiting); {found} (the times differ from run to run)."
