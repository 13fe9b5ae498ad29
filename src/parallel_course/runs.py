"""What a training run leaves in its ``--out`` folder (``c04_train_ddp.py`` and ``train_ddp.py``, chapters 04 and 09;
``train_gpt.py``, chapter 11), a plot of the memory each rank reported, and the check that two runs
trained alike: their losses and their gradient norms (chapter 15)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .checks import CheckFailed, check_close, scale_of

# What two runs must share to have trained alike, per step: the loss, and the whole gradient's norm
# before clipping, which sees a gradient off by a constant factor that AdamW hides from the loss.
TRAINED_ALIKE = ("losses", "gradient_norms")


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


def relative_gaps(run: dict, reference: dict, key: str, steps: slice = slice(None)) -> torch.Tensor:
    """Per step, (run - reference) / reference of a per-step figure of metrics.json (``losses``,
    ``gradient_norms``); ``steps``: the reference's steps the run trained (a resumed run's, say)."""
    got, expected = torch.tensor(run[key], dtype=torch.float64), torch.tensor(reference[key], dtype=torch.float64)
    return (got - expected[steps]) / expected[steps]


def check_trained_alike(what: str, run: dict, reference: dict, tolerance: float, steps: slice = slice(None)) -> None:
    """Check that a run's losses and gradient norms equal a reference's, step by step, within a
    relative tolerance: a line each (parallel_course.checks), CheckFailed at the first that differs."""
    for key in TRAINED_ALIKE:
        gaps = relative_gaps(run, reference, key, steps)
        check_close(f"{what}: {key}, relative", gaps, torch.zeros_like(gaps), atol=tolerance)


def check_negative_control(what: str, run: dict, reference: dict, tolerance: float, steps: slice = slice(None)) -> None:
    """A run made with a mistake that AdamW hides: its losses pass check_trained_alike's check and
    its gradient norms must fail it. Prints both verdicts (the FAIL says by what factor the norms are
    off, if one fits them all); raises AssertionError if the norms pass (the check would miss it)."""
    gaps = relative_gaps(run, reference, "losses", steps)
    check_close(f"{what}: losses, relative", gaps, torch.zeros_like(gaps), atol=tolerance)
    gaps = relative_gaps(run, reference, "gradient_norms", steps)
    scale = scale_of(run["gradient_norms"], reference["gradient_norms"][steps], rtol=tolerance)
    try:
        check_close(
            f"{what}: gradient_norms, relative",
            gaps,
            torch.zeros_like(gaps),
            atol=tolerance,
            slip=None if scale is None else f"the norms are {scale:.3g} times the reference's",
        )
    except CheckFailed as failed:
        print(f"negative control: {failed}")
        return
    raise AssertionError(f"{what}: the gradient norms passed: this check cannot see the mistake")
