"""Chapter 13b's figure, drawn from its own routing: every expert's buffer of ``capacity`` slots as
``gpt.route`` filled it (which token's which choice took which slot, in the order the router hands
slots out), the empty slots, and the choices that came after the buffer was full: dropped.

``expert_slots`` turns route's tensors into what is drawn where; ``draw_expert_slots`` only places
it on Axes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

# A token's first choice, its second (and later) choices, a dropped choice, an empty slot.
CHOICE_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#cdb4db"]
DROPPED_COLOUR = "#f4a3a3"
TOKEN_COLOUR = "#5b8fc7"


@dataclass(frozen=True)
class Slot:
    """One choice routed to an expert: the slot it asked for, the token, which of the token's
    choices it is (1 = first), its gate, and whether it fit in the expert's capacity."""

    slot: int
    token: int
    choice: int
    gate: float
    kept: bool


def expert_slots(
    experts: torch.Tensor, gates: torch.Tensor, slots: torch.Tensor, kept: torch.Tensor, n_experts: int
) -> list[list[Slot]]:
    """Per expert, the choices routed to it in slot order, from ``route``'s (experts, gates, slots,
    kept), each (tokens, top_k)."""
    buffers: list[list[Slot]] = [[] for _ in range(n_experts)]
    tokens, top_k = experts.shape
    for t in range(tokens):
        for j in range(top_k):
            e = int(experts[t, j])
            buffers[e].append(Slot(int(slots[t, j]), t, j + 1, float(gates[t, j]), bool(kept[t, j])))
    return [sorted(b, key=lambda s: s.slot) for b in buffers]


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def draw_expert_slots(ax, buffers: list[list[Slot]], capacity: int) -> None:
    """A row per expert, a box per slot: the capacity's slots (filled by a token's choice, or
    empty), then, past the red line, the choices that found the expert full."""
    width = max([capacity] + [s.slot + 1 for b in buffers for s in b])
    n = len(buffers)
    for e, buffer in enumerate(buffers):
        y = n - 1 - e
        ax.text(-0.15, y + 0.4, f"expert {e}", ha="right", va="center", fontsize=15)
        taken = {s.slot: s for s in buffer}
        for i in range(width):
            s = taken.get(i)
            if s is None:
                if i < capacity:
                    ax.add_patch(Rectangle((i + 0.05, y), 0.9, 0.8, facecolor="white", edgecolor="0.5", linestyle="--"))
                    ax.text(i + 0.5, y + 0.4, "empty", ha="center", va="center", fontsize=13, color="0.45")
                continue
            colour = CHOICE_COLOURS[(s.choice - 1) % 4] if s.kept else DROPPED_COLOUR
            ax.add_patch(
                Rectangle(
                    (i + 0.05, y),
                    0.9,
                    0.8,
                    facecolor=colour,
                    edgecolor="#c1121f" if not s.kept else "black",
                    linestyle="-" if s.kept else "--",
                    linewidth=1.6 if not s.kept else 0.8,
                    hatch=None if s.kept else "//",
                )
            )
            label = f"token {s.token}\n{_ordinal(s.choice)} choice"
            box = None if s.kept else {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5}
            ax.text(
                i + 0.5,
                y + 0.4,
                label + ("" if s.kept else "\nDROPPED"),
                ha="center",
                va="center",
                fontsize=13,
                bbox=box,
            )
    ax.axvline(capacity, color="#c1121f", linewidth=2.5)
    ax.text(
        capacity + 0.1,
        n + 0.05,
        f"capacity: {capacity} slots; past it, dropped",
        ha="left",
        va="bottom",
        fontsize=13,
        color="#c1121f",
    )
    for i in range(width):
        name = f"slot {i}" if i < capacity else f"(slot {i})"
        ax.text(i + 0.5, -0.1, name, ha="center", va="top", fontsize=13, color="0.3")
    ax.set(xlim=(-1.3, width + 0.1), ylim=(-0.5, n + 0.45))
    ax.axis("off")


def expert_slots_figure(buffers: list[list[Slot]], capacity: int, top_k: int) -> Figure:
    tokens = len({s.token for b in buffers for s in b})
    fig = Figure(figsize=(11, 1.15 * len(buffers) + 2.0), layout="constrained")
    fig.suptitle(
        f"{tokens} tokens, top-{top_k}, routed to {len(buffers)} experts of {capacity} slots each: slots are handed "
        "out in token order,\nevery first choice before any second; a choice that finds its expert full is dropped",
        fontsize=14,
    )
    draw_expert_slots(fig.add_subplot(), buffers, capacity)
    handles = [
        Patch(facecolor=CHOICE_COLOURS[j], edgecolor="black", label=f"a token's {_ordinal(j + 1)} choice")
        for j in range(top_k)
    ]
    handles.append(
        Patch(facecolor=DROPPED_COLOUR, edgecolor="#c1121f", hatch="//", linestyle="--", label="dropped: past capacity")
    )
    handles.append(Patch(facecolor="white", edgecolor="0.5", linestyle="--", label="empty slot"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=13, frameon=False)
    return fig


def describe_expert_slots(buffers: list[list[Slot]], capacity: int) -> str:
    """The figure's text alternative: per expert, its slots in order, the empty ones and the drops."""
    parts = []
    for e, buffer in enumerate(buffers):
        kept = [f"slot {s.slot}: token {s.token} ({_ordinal(s.choice)} choice)" for s in buffer if s.kept]
        dropped = [f"token {s.token} ({_ordinal(s.choice)} choice)" for s in buffer if not s.kept]
        empty = capacity - len(kept)
        text = f"Expert {e}: " + (", ".join(kept) or "no token")
        text += f"; {empty} empty slot{'s' if empty != 1 else ''}" if empty else ""
        text += f"; dropped: {', '.join(dropped)}" if dropped else ""
        parts.append(text + ".")
    return f"Each expert's buffer of {capacity} slots as the router filled it. " + " ".join(parts)


@dataclass
class Traffic:
    """What expert parallelism's dispatch all-to-all carries: ``tokens[src][dst]``, the kept choices
    of rank src's tokens whose expert lives on rank dst, in a block of ``slots`` slots (the same for
    every pair: E/R experts x capacity); ``dropped[src]``, rank src's choices that found no slot;
    ``experts[dst]``, the experts rank dst holds. The combine all-to-all sends the same blocks back:
    its matrix is the transpose."""

    tokens: list[list[int]]
    slots: int
    dropped: list[int]
    experts: list[list[int]]


def all_to_all_traffic(routed: list[tuple[torch.Tensor, torch.Tensor]], n_experts: int, capacity: int) -> Traffic:
    """From each rank's own routing (its ``route`` experts and kept, each (tokens, top_k)), with the
    experts split evenly and in order over the ranks (rank j holds experts j*E/R ...)."""
    ranks = len(routed)
    if n_experts % ranks:
        raise ValueError(f"{n_experts} experts do not split evenly over {ranks} ranks")
    per_rank = n_experts // ranks
    tokens = [[0] * ranks for _ in range(ranks)]
    dropped = []
    for src, (experts, kept) in enumerate(routed):
        for dst in range(ranks):
            home = (experts // per_rank) == dst
            tokens[src][dst] = int((home & kept).sum())
        dropped.append(int((~kept).sum()))
    held = [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(ranks)]
    return Traffic(tokens, per_rank * capacity, dropped, held)


def _holds(experts: list[int]) -> str:
    return f"expert {experts[0]}" if len(experts) == 1 else f"experts {experts[0]}-{experts[-1]}"


def draw_traffic(ax, matrix: list[list[int]], slots: int, title: str, experts: list[list[int]]) -> None:
    """A cell per (sender row, receiver column): the block it sends, filled from the bottom with
    the tokens in it, the rest (padding) left empty."""
    n = len(matrix)
    for i, row in enumerate(matrix):
        y = n - 1 - i
        for j, count in enumerate(row):
            ax.add_patch(Rectangle((j, y), 0.94, 0.9, facecolor="white", edgecolor="0.4", linestyle="--"))
            ax.add_patch(Rectangle((j, y), 0.94, 0.9 * count / slots, facecolor=TOKEN_COLOUR, edgecolor="0.4"))
            ax.text(
                j + 0.47,
                y + 0.45,
                f"{count}\nof {slots}",
                ha="center",
                va="center",
                fontsize=13,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5},
            )
        ax.text(-0.1, y + 0.45, f"from rank {i}\n({_holds(experts[i])})", ha="right", va="center", fontsize=12)
    for j in range(n):
        ax.text(j + 0.47, n + 0.02, f"to rank {j}\n({_holds(experts[j])})", ha="center", va="bottom", fontsize=12)
    ax.set_title(title, fontsize=13)
    ax.set(xlim=(-1.5, n), ylim=(-0.1, n + 0.6))
    ax.axis("off")


def traffic_figure(traffic: Traffic, layer: str) -> Figure:
    ranks = len(traffic.tokens)
    fig = Figure(figsize=(12, 0.95 * ranks + 2.6), layout="constrained")
    fig.suptitle(
        f"Expert parallelism on {ranks} ranks, {layer}: each all-to-all sends every rank one block of "
        f"{traffic.slots} slots,\nfilled with the tokens routed to that rank's experts; the rest is padding",
        fontsize=13,
    )
    dispatch, combine = fig.subplots(1, 2)
    draw_traffic(dispatch, traffic.tokens, traffic.slots, "dispatch: tokens to their experts", traffic.experts)
    back = [list(col) for col in zip(*traffic.tokens)]
    draw_traffic(combine, back, traffic.slots, "combine: outputs back to their tokens' ranks", traffic.experts)
    handles = [
        Patch(facecolor=TOKEN_COLOUR, edgecolor="0.4", label="slots holding a token"),
        Patch(facecolor="white", edgecolor="0.4", linestyle="--", label="padding: sent all the same"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=12, frameon=False)
    return fig


def describe_traffic(traffic: Traffic, layer: str) -> str:
    """The figure's text alternative: the tokens in each block of the dispatch, and the drops."""
    ranks = len(traffic.tokens)
    pairs = "; ".join(f"rank {i} to rank {j}: {traffic.tokens[i][j]}" for i in range(ranks) for j in range(ranks))
    return (
        f"Expert parallelism on {ranks} ranks, {layer}: tokens in each block of {traffic.slots} slots of the dispatch "
        f"all-to-all, {pairs}. The combine all-to-all sends the same blocks back (the transpose). Choices dropped on "
        f"each rank: {traffic.dropped}."
    )
