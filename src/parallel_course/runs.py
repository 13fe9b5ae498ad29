"""What a training run leaves in its ``--out`` folder (``c04_train_ddp.py`` and ``train_ddp.py``, chapters 04 and 09;
``train_gpt.py``, chapter 11), a plot of the memory each rank reported, and the check that two runs
trained alike: their losses and their gradient norms (chapter 15)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import figure_output
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


def describe_memory_by_layout(runs: dict[str, dict], rank: int = 0) -> str:
    """The text alternative of ``plot_memory_by_layout``'s bars: what ``rank`` holds in each run, by part, in kB."""
    rows = [
        f"{layout} ({run['world_size']} process{'es' if run['world_size'] > 1 else ''}): "
        + ", ".join(
            f"{p.replace('_bytes', '').replace('_', ' ')} {run['memory'][rank][p] / 1e3:.1f}" for p in MEMORY_PARTS
        )
        for layout, run in runs.items()
    ]
    return f"Grouped bars, kB held on rank {rank} by layout: " + "; ".join(rows) + "."


def describe_learning(losses: list[float], solved: dict[int, float]) -> tuple[str, str]:
    """The text alternative of ``plot_learning``'s two panels: the loss at the first, middle and last
    step and its lowest, and the share solved at each step measured; and a plain text without the
    numbers (the last digits of a training run differ between machines and devices)."""
    middle = len(losses) // 2
    what = f"Loss over the answer digits (log scale) at each of {len(losses)} steps, and unseen problems solved (%)"
    loss = (
        f"loss {losses[0]:.3f} at step 1, {losses[middle - 1]:.3f} at step {middle}, "
        f"{losses[-1]:.3f} at step {len(losses)}, lowest {min(losses):.3f}"
    )
    solved_text = ", ".join(f"{100 * s:.0f}% at step {k}" for k, s in solved.items())
    alt = f"{what}: {loss}; solved {solved_text}."
    return alt, f"{what} every {next(iter(solved))} steps (the numbers differ slightly between machines)."


def show_memory_by_layout(runs: dict[str, dict], rank: int = 0) -> None:
    """``plot_memory_by_layout``'s bars, shown with ``describe_memory_by_layout`` as their text alternative."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5), layout="tight")
    plot_memory_by_layout(ax, runs, rank)
    figure_output.show(fig, describe_memory_by_layout(runs, rank))


def show_learning(losses: list[float], solved: dict[int, float]) -> None:
    """``plot_learning``'s two panels, shown with ``describe_learning``'s text alternative and plain text."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8), layout="tight")
    plot_learning(axes, losses, solved)
    alt, plain = describe_learning(losses, solved)
    figure_output.show(fig, alt, plain=plain)
