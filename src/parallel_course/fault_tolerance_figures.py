"""Chapter 09's figures, drawn from what its launches wrote: a job's timeline through a crash, its
checkpoints and the restart that resumes from one (the lines the run printed, its error output and
its ``metrics.json``), and which rank failed and which ranks only went down with it, in a crash and
in a hang (torchrun's report and the ranks' tracebacks). Chapter 11c draws its jobs that stop and
continue in another layout with the same timeline.

``attempts_from_run``, ``rank_ends`` and ``TimelineRow`` compute what is drawn where; the ``draw_``
functions only place it on Axes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .collective_figures import RANK_COLOURS

FAILED_COLOUR = "#e63946"
VICTIM_COLOUR = "#adb5bd"


@dataclass
class TimelineRow:
    """One attempt of a job, or one job of a chain: the steps it completed (``first`` to ``last``),
    the steps after which it saved a checkpoint, the step it failed in (None if it did not), the
    row and step it resumed from (None if it started from scratch), and the steps it ran again
    (an earlier attempt had completed them)."""

    label: str
    first: int
    last: int
    checkpoints: list[int] = field(default_factory=list)
    failed_in: int | None = None
    resumed_from: tuple[int, int] | None = None
    repeated: list[int] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return list(range(self.first, self.last + 1))


def _attempts(stdout: str) -> list[list[str]]:
    """The run's printed lines, one list per attempt: each attempt starts with the script's
    ``backend=...`` line."""
    attempts = []
    for line in stdout.splitlines():
        if line.startswith("backend="):
            attempts.append([])
        if attempts and line.strip():
            attempts[-1].append(line)
    return attempts


def attempts_from_run(stdout: str, errors: str, metrics: dict, checkpoint_every: int) -> list[TimelineRow]:
    """The attempts of one ``train_ddp.py`` job under ``torchrun --max-restarts``: from the lines it
    printed (one ``backend=`` line per attempt, ``attempt N: resumed from ... at step S``), its error
    output (``injected failure: rank R in step S``, the failure that ended an attempt), its
    ``metrics.json`` (the steps of the whole run, the restarts) and its ``--checkpoint-every``.
    Raises ValueError where they disagree: an attempt that did not resume from the last checkpoint
    the attempt before it saved, or a count of attempts that is not the restarts plus one."""
    printed = _attempts(stdout)
    if len(printed) != metrics["restarts"] + 1:
        raise ValueError(f"{len(printed)} attempts printed, metrics.json counts {metrics['restarts']} restarts")
    failures = [int(s) for s in re.findall(r"injected failure: rank \d+ in step (\d+)", errors)]
    rows: list[TimelineRow] = []
    for k, lines in enumerate(printed):
        resumed = [int(m.group(1)) for line in lines if (m := re.search(r"resumed from .* at step (\d+)", line))]
        start = resumed[0] if resumed else 0
        if k < len(printed) - 1:
            if k >= len(failures):
                raise ValueError(f"attempt {k} ended, but the errors name no failure for it")
            failed_in, last = failures[k], failures[k] - 1
        else:
            failed_in, last = None, metrics["steps"]
        row = TimelineRow(f"attempt {k}", start + 1, last, failed_in=failed_in)
        row.checkpoints = [s for s in row.steps if s % checkpoint_every == 0]
        if k > 0:
            before = rows[-1]
            saved = before.checkpoints[-1] if before.checkpoints else 0
            if start != saved:
                raise ValueError(f"attempt {k} resumed from step {start}, the last checkpoint saved was step {saved}")
            row.resumed_from = (k - 1, saved)
            done = max(r.last for r in rows)
            row.repeated = [s for s in row.steps if s <= done]
        rows.append(row)
    return rows


def draw_timeline(ax, rows: list[TimelineRow], epoch_ends: list[int] = (), colours: list[str] | None = None) -> None:
    """A row per attempt (or job): a box per step it completed, red for the step it failed in,
    hatched where it ran a step again; a diamond after each step it saved; an arrow from the
    checkpoint a row resumed from to its first step; dashed lines at the ends of epochs."""
    colours = colours or RANK_COLOURS
    n = len(rows)
    for i, row in enumerate(rows):
        y = n - 1 - i
        for s in row.steps:
            again = s in row.repeated
            ax.add_patch(
                Rectangle(
                    (s - 0.45, y - 0.3),
                    0.9,
                    0.6,
                    facecolor=colours[i % len(colours)],
                    edgecolor="black",
                    hatch="///" if again else None,
                    linewidth=0.8,
                )
            )
        if row.failed_in is not None:
            s = row.failed_in
            ax.add_patch(Rectangle((s - 0.45, y - 0.3), 0.9, 0.6, facecolor=FAILED_COLOUR, edgecolor="black"))
            ax.text(s, y, "✗", ha="center", va="center", fontsize=14, color="white", weight="bold")
        for s in row.checkpoints:
            ax.plot(s + 0.5, y + 0.42, marker="D", markersize=9, color="black", zorder=5)
        if row.resumed_from is not None:
            source, step = row.resumed_from
            ax.annotate(
                "",
                xy=(row.first - 0.45, y + 0.1),
                xytext=(step + 0.5, n - 1 - source + 0.35),
                arrowprops={"arrowstyle": "-|>", "lw": 1.8, "color": "tab:green", "connectionstyle": "arc3,rad=0.25"},
                zorder=6,
            )
    for end in epoch_ends:
        ax.axvline(end + 0.5, color="0.4", linestyle="--", linewidth=1, zorder=0)
    last = max(max(r.last, r.failed_in or 0) for r in rows)
    ax.set_yticks(range(n), [r.label for r in reversed(rows)], fontsize=13)
    ax.set_xticks(range(1, last + 1))
    # A checkpoint of step 0 (a seed) sits before step 1.
    left = -0.2 if any(0 in r.checkpoints for r in rows) else 0.3
    ax.set(xlim=(left, last + 0.9), ylim=(-0.7, n - 0.3))
    ax.set_xlabel("step", fontsize=12)
    ax.tick_params(axis="x", labelsize=11)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def timeline_key(ax, failed: bool = True, repeated: bool = True, epochs: bool = True) -> None:
    """The key of ``draw_timeline``: what the marks mean."""
    handles = [
        Patch(facecolor="white", edgecolor="black", label="step completed"),
        Line2D([], [], marker="D", color="black", linestyle="none", label="checkpoint saved"),
        Line2D([], [], color="tab:green", linewidth=1.8, label="resumed from it"),
    ]
    if failed:
        handles.insert(1, Patch(facecolor=FAILED_COLOUR, edgecolor="black", label="step that failed"))
    if repeated:
        handles.insert(2, Patch(facecolor="white", edgecolor="black", hatch="///", label="step run again"))
    if epochs:
        handles.append(Line2D([], [], color="0.4", linestyle="--", label="end of an epoch"))
    ax.figure.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=12, frameon=False)


def timeline_figure(
    rows: list[TimelineRow], epoch_ends: list[int] = (), width: float = 12, row_height: float = 0.75
) -> Figure:
    """``draw_timeline`` with its key, on a figure of its own."""
    fig = Figure(figsize=(width, 1.6 + row_height * len(rows)), layout="constrained")
    ax = fig.subplots()
    draw_timeline(ax, rows, epoch_ends)
    failed = any(r.failed_in is not None for r in rows)
    timeline_key(ax, failed=failed, repeated=any(r.repeated for r in rows), epochs=bool(epoch_ends))
    return fig


def describe_timeline(rows: list[TimelineRow]) -> str:
    """The text alternative of ``draw_timeline``."""
    parts = []
    for row in rows:
        text = f"{row.label}: steps {row.first} to {row.last} completed" if row.steps else f"{row.label}: no step run"
        if row.resumed_from is not None:
            source, step = row.resumed_from
            text = f"{row.label}: resumed from {rows[source].label}'s step-{step} checkpoint, " + (
                f"steps {row.first} to {row.last} completed"
            )
        if row.repeated:
            again = ", ".join(map(str, row.repeated))
            text += f" (steps {again} run again)" if len(row.repeated) > 1 else f" (step {again} run again)"
        if row.checkpoints:
            saved = ", ".join(map(str, row.checkpoints))
            text += (
                f", checkpoints after steps {saved}"
                if len(row.checkpoints) > 1
                else f", a checkpoint after step {saved}"
            )
        if row.failed_in is not None:
            text += f", failed in step {row.failed_in}"
        parts.append(text + ".")
    return " ".join(parts)


# What a rank that did not fail by itself reports: its collective lost the peer, or torchrun stopped it.
LOST_PEER = ("Connection closed by peer", "Connection reset by peer")
STOPPED = ("Signal 15 (SIGTERM)", "Signal 6 (SIGABRT)", "(SIGTERM)")


@dataclass
class RankEnd:
    """How one rank of a failed attempt ended: the culprit, or a victim of another rank's failure;
    what it did in the step that failed, and how it ended."""

    rank: int
    culprit: bool
    did: str
    ended: str


def rank_errors(err: str) -> dict[int, str]:
    """The last line each rank's uncaught exception printed to stderr (torch prefixes them with
    ``[rankN]:``); a rank that printed none is absent."""
    found = {}
    for rank, line in re.findall(r"(?m)^\[rank(\d+)\]: (.*)$", err):
        found[int(rank)] = line.strip()
    return found


def rank_ends(errors: dict[int, str], world_size: int, step: int) -> list[RankEnd]:
    """Each rank's part in a failed attempt, from the last error line each rank wrote (absent: it
    wrote none). A rank whose own error is neither a lost peer, a timeout nor a signal raised it: the
    culprit. A rank that timed out or lost its peer waited for another: a victim. A rank with no
    error of its own, or a signal, was stopped by torchrun: a victim if another rank raised, else
    the culprit (it stopped answering, and the others timed out waiting for it)."""
    kinds = {}
    for rank in range(world_size):
        line = errors.get(rank)
        if line is None or any(s in line for s in STOPPED):
            kinds[rank] = "stopped"
        elif any(s in line for s in LOST_PEER):
            kinds[rank] = "lost peer"
        elif m := re.search(r"Timed out waiting (\d+)ms", line):
            kinds[rank] = f"timeout {m.group(1)}"
        else:
            kinds[rank] = "raised"
    someone_raised = "raised" in kinds.values()
    ends = []
    for rank, kind in kinds.items():
        if kind == "raised":
            ends.append(RankEnd(rank, True, f"raises in step {step}", "exits with its own error"))
        elif kind == "lost peer":
            ends.append(RankEnd(rank, False, f"waits in step {step}'s all-reduce", "error: lost its peer"))
        elif kind.startswith("timeout"):
            ms = int(kind.split()[1])
            ends.append(RankEnd(rank, False, f"waits in step {step}'s all-reduce", f"error: timed out after {ms} ms"))
        elif someone_raised:
            ends.append(RankEnd(rank, False, f"waits in step {step}'s all-reduce", "stopped by torchrun (SIGTERM)"))
        else:
            ends.append(RankEnd(rank, True, f"stops answering in step {step}", "stopped by torchrun (SIGTERM)"))
    return ends


def draw_rank_ends(ax, title: str, ends: list[RankEnd]) -> None:
    """A lane per rank: what it did in the failing step, then how it ended; the culprit red, the
    victims grey; below, whose error the log shows first."""
    n = len(ends)
    for i, end in enumerate(ends):
        y = n - 1 - i
        face = FAILED_COLOUR if end.culprit else VICTIM_COLOUR
        ax.text(-0.1, y, f"rank {end.rank}", ha="right", va="center", fontsize=14, weight="bold")
        ax.add_patch(Rectangle((0, y - 0.32), 2.6, 0.64, facecolor=face, edgecolor="black", alpha=0.9))
        ax.text(1.3, y, end.did, ha="center", va="center", fontsize=13)
        ax.annotate("", xy=(3.0, y), xytext=(2.62, y), arrowprops={"arrowstyle": "-|>", "lw": 1.5})
        ax.add_patch(Rectangle((3.0, y - 0.32), 3.0, 0.64, facecolor="white", edgecolor=face, linewidth=2.5))
        ax.text(4.5, y, end.ended, ha="center", va="center", fontsize=13)
        role = "culprit" if end.culprit else "victim"
        ax.text(6.1, y, role, ha="left", va="center", fontsize=14, color=face if end.culprit else "0.35", weight="bold")
    ax.text(1.3, n - 0.5, "in the step that failed", ha="center", va="center", fontsize=12, color="0.35")
    ax.text(4.5, n - 0.5, "how it ended", ha="center", va="center", fontsize=12, color="0.35")
    ax.set_title(title, fontsize=15)
    ax.set(xlim=(-1.0, 7.0), ylim=(-0.6, n - 0.3))
    ax.axis("off")


def describe_rank_ends(title: str, ends: list[RankEnd]) -> str:
    """The text alternative of ``draw_rank_ends``."""
    return (
        f"{title}: "
        + "; ".join(f"rank {e.rank} {e.did}, {e.ended}: {'the culprit' if e.culprit else 'a victim'}" for e in ends)
        + "."
    )


def describe_roles(title: str, ends: list[RankEnd]) -> str:
    """Who was the culprit and who a victim, without how each victim ended: a victim of a crash
    either lost its peer or was stopped first, a race (a text that does not vary from run to run)."""
    return (
        f"{title}: "
        + "; ".join(f"rank {e.rank} {e.did}: {'the culprit' if e.culprit else 'a victim'}" for e in ends)
        + "."
    )


def rank_ends_figure(panels: list[tuple[str, list[RankEnd]]]) -> Figure:
    """``draw_rank_ends`` for each (title, ends), one above the other."""
    fig = Figure(figsize=(11, 2.1 * len(panels)), layout="constrained")
    for ax, (title, ends) in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels):
        draw_rank_ends(ax, title, ends)
    return fig
