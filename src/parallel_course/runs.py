"""What a training run leaves in its ``--out`` folder (``c04_train_ddp.py`` and ``train_ddp.py``, chapters 04 and 09;
``train_gpt.py``, chapter 11), and a plot of the memory each rank reported."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def final_weights(out_dir: str | Path) -> torch.Tensor:
    """A run's ``final.pt`` as one flat vector, in the state_dict's order, on the CPU; loaded with
    ``weights_only=True``, so no pickled code runs."""
    state = torch.load(Path(out_dir) / "final.pt", map_location="cpu", weights_only=True)
    return torch.cat([t.flatten() for t in state.values()])


def metrics(out_dir: str | Path) -> dict:
    """A run's ``metrics.json``."""
    return json.loads((Path(out_dir) / "metrics.json").read_text())


MEMORY_PARTS = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "activation_bytes")


def plot_memory_by_layout(ax, runs: dict[str, dict], rank: int = 0) -> None:
    """Grouped bars on ``ax``: what ``rank`` holds in each run (``train_gpt.py``'s ``metrics.json``,
    by layout name), one bar per part of ``MEMORY_PARTS``, in kB."""
    width = 0.8 / len(MEMORY_PARTS)
    for i, part in enumerate(MEMORY_PARTS):
        ax.bar(
            [j + width * i for j in range(len(runs))],
            [run["memory"][rank][part] / 1e3 for run in runs.values()],
            width=width,
            label=part.replace("_bytes", "").replace("_", " "),
        )
    ax.set_xticks(
        [j + 0.4 - width / 2 for j in range(len(runs))], [f"{k} ({r['world_size']})" for k, r in runs.items()]
    )
    ax.set(ylabel=f"kB on rank {rank}", title="What one rank holds, by layout (processes in brackets)")
    ax.legend(fontsize=8)


def plot_learning(axes, losses: list[float], solved: dict[int, float]) -> None:
    """Two panels on ``axes``: the loss of every step (log scale), and the share of unseen problems
    solved (``solved``: step -> fraction), in percent."""
    loss_ax, solved_ax = axes
    loss_ax.semilogy(range(1, len(losses) + 1), losses)
    loss_ax.set(xlabel="step", title="loss over the answer digits")
    solved_ax.plot(list(solved), [100 * s for s in solved.values()], "o-", markersize=3)
    solved_ax.set(xlabel="step", ylim=(0, 105), title="unseen problems solved (%)")
