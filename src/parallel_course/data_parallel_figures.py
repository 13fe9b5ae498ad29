"""Chapter 02's figure, drawn from its own computation: one ``nn.DataParallel`` step as the chapter
re-enacts it (the chunks ``scatter`` made, the replicas, the threads that ran them as a hook
recorded, the gathered output, and the gradients ``backward()`` left in each replica and summed).

``data_parallel_step_picture`` turns that step into what is drawn where; the ``draw_`` functions
only place it on Axes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

RANK_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff", "#d9d9d9"]

# --- 02: one DataParallel step --------------------------------------------------------------------


@dataclass
class DataParallelStep:
    """What one re-enacted DataParallel step did on each device: the chunk it got (shape), its
    replica (parameters, and whether it is a copy in memory of its own), the thread that ran
    the replica, its output (shape), and the norm of the gradient ``backward()`` left in the
    replica's first parameter; then the gathered output and the model's summed gradient."""

    devices: list[str]
    batch_shape: tuple[int, ...]
    chunk_shapes: list[tuple[int, ...]]
    replica_parameters: list[int]
    separate_copies: list[bool]
    threads: list[str]
    output_shapes: list[tuple[int, ...]]
    gathered_shape: tuple[int, ...]
    gathered_device: str
    parameter: str
    replica_grad_norms: list[float]
    summed_grad_norm: float


def data_parallel_step_picture(
    devices, inputs, chunks, model, replicas, ran_on, replica_outputs, outputs
) -> DataParallelStep:
    """The step's record, from the tensors it made: ``ran_on`` is the names of the threads that
    ran the replicas, in the order a forward hook recorded them (each names its device). Refuses
    a record whose parts disagree: a chunk count other than the devices', a replica not run, or a
    model gradient that is not the replicas' sum (``reduce_gradients`` not called)."""
    devices = list(devices)
    if not len(chunks) == len(replica_outputs) == len(devices):
        raise ValueError(f"{len(devices)} devices, {len(chunks)} chunks, {len(replica_outputs)} outputs")
    threads = []
    for device in devices:
        ran = [name for name in ran_on if name.endswith(" " + device)]
        if len(ran) != 1:
            raise ValueError(f"the replica on {device} ran {len(ran)} times, not once: {ran_on}")
        threads.append(ran[0])
    name, first = next(iter(model.named_parameters()))
    grads = [dict(r.named_parameters())[name].grad for r in replicas[: len(devices)]]
    if first.grad is None or any(g is None for g in grads):
        raise ValueError("no gradients: run backward() and reduce_gradients() first")
    total = torch.stack([g.to(first.device) for g in grads]).sum(0)
    if not torch.allclose(total, first.grad, atol=1e-6):
        raise ValueError(f"the model's gradient of {name} is not the sum of its replicas'")
    own = [p.data_ptr() for p in model.parameters()]
    return DataParallelStep(
        devices=devices,
        batch_shape=tuple(inputs.shape),
        chunk_shapes=[tuple(c.shape) for c in chunks],
        replica_parameters=[sum(p.numel() for p in r.parameters()) for r in replicas[: len(devices)]],
        separate_copies=[all(p.data_ptr() not in own for p in r.parameters()) for r in replicas[: len(devices)]],
        threads=threads,
        output_shapes=[tuple(o.shape) for o in replica_outputs],
        gathered_shape=tuple(outputs.shape),
        gathered_device=devices[0],
        parameter=name,
        replica_grad_norms=[g.norm().item() for g in grads],
        summed_grad_norm=first.grad.norm().item(),
    )


def _shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


# The columns of the step: x position and heading.
STEP_COLUMNS = [
    (0.0, "on device 0"),
    (1.0, "1 · scatter the batch\n2 · replicate the model"),
    (2.0, "3 · parallel_apply"),
    (3.0, "4 · gather, loss"),
    (4.0, "backward():\neach replica's grad"),
    (5.0, "summed into\nthe model"),
]


def _box(ax, x, y, text, colour, dashed=False, height=0.68):
    ax.add_patch(
        FancyBboxPatch(
            (x - 0.43, y - height / 2),
            0.86,
            height,
            boxstyle="round,pad=0,rounding_size=0.06",
            facecolor=colour,
            edgecolor="black",
            linewidth=0.8,
            linestyle="--" if dashed else "-",
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=11.5)


def _arrow(ax, start, end, backward=False, copy=False):
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=10,
            color="#c1121f" if backward else "0.3",
            linestyle="--" if backward else (":" if copy else "-"),
            linewidth=1.1,
            shrinkA=0,
            shrinkB=0,
        )
    )


def draw_data_parallel_step(ax, step: DataParallelStep) -> None:
    """A row per device, a column per phase: single boxes on device 0 where everything starts or
    meets (the batch and the model, the gathered output, the summed gradient), one per device
    elsewhere; grey arrows forward (dotted: a copy of the model), red dashed arrows backward."""
    n = len(step.devices)
    ys = [n - 1 - i for i in range(n)]
    for x, heading in STEP_COLUMNS:
        ax.text(x, n - 0.35, heading, ha="center", va="bottom", fontsize=13, weight="bold")
    top = ys[0]
    half = 0.3
    _box(ax, 0, top + 0.19, f"inputs {_shape(step.batch_shape)}", "0.9", height=half)
    _box(ax, 0, top - 0.19, f"model, {step.replica_parameters[0]:,} params", "0.9", height=half)
    for i, (device, y) in enumerate(zip(step.devices, ys)):
        colour = RANK_COLOURS[i % len(RANK_COLOURS)]
        ax.text(-0.55, y, device, ha="right", va="center", fontsize=13, family="monospace")
        _box(ax, 1, y + 0.19, f"chunk {_shape(step.chunk_shapes[i])}", colour, height=half)
        shared = "" if step.separate_copies[i] else " (SHARED memory)"
        _box(ax, 1, y - 0.19, f"replica, {step.replica_parameters[i]:,} params{shared}", colour, height=half)
        _box(ax, 2, y, f"thread\n'{step.threads[i]}'\nout {_shape(step.output_shapes[i])}", colour)
        _box(ax, 4, y, f"|grad {step.parameter}|\n{step.replica_grad_norms[i]:.4f}", colour, dashed=True)
        _arrow(ax, (0.43, top + 0.19), (0.57, y + 0.19))
        _arrow(ax, (0.43, top - 0.19), (0.57, y - 0.19), copy=True)
        _arrow(ax, (1.43, y), (1.57, y))
        _arrow(ax, (2.43, y), (2.57, top))
        _arrow(ax, (3.43, top), (3.57, y), backward=True)
        _arrow(ax, (4.43, y), (4.57, top), backward=True)
    _box(ax, 3, top, f"outputs\n{_shape(step.gathered_shape)}\nloss on {step.gathered_device}", "0.9")
    _box(ax, 5, top, f"sum: |grad {step.parameter}|\n{step.summed_grad_norm:.4f}\non {step.devices[0]}", "#a7d7c5")
    ax.legend(
        handles=[
            Line2D([], [], color="0.3", label="forward: scatter, apply, gather"),
            Line2D([], [], color="0.3", linestyle=":", label="the model copied (every step)"),
            Line2D([], [], color="#c1121f", linestyle="--", label="backward: output grads in, replica grads summed"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=3,
        fontsize=12.5,
        frameon=False,
    )
    ax.set(xlim=(-1.2, 5.5), ylim=(-0.55, n + 0.35))
    ax.axis("off")


def data_parallel_step_figure(step: DataParallelStep, title: str | None = None) -> Figure:
    fig = Figure(figsize=(14.5, 1.5 * len(step.devices) + 1.9), layout="constrained")
    ax = fig.subplots()
    draw_data_parallel_step(ax, step)
    ax.set_title(
        title or "One DataParallel step, as it ran here: every box is a tensor or module the step made", fontsize=16
    )
    return fig


def describe_data_parallel_step(step: DataParallelStep) -> str:
    """The text alternative: per device, its chunk, replica, thread and output; then the gather
    and the summed gradient."""
    per_device = "; ".join(
        f"{d}: chunk {_shape(c)}, a replica of {p:,} parameters ({'its own copy' if own else 'shared memory'}) "
        f"run by thread '{t}', output {_shape(o)}"
        for d, c, p, own, t, o in zip(
            step.devices,
            step.chunk_shapes,
            step.replica_parameters,
            step.separate_copies,
            step.threads,
            step.output_shapes,
        )
    )
    return (
        f"One DataParallel step over {len(step.devices)} devices, a row per device. The batch "
        f"{_shape(step.batch_shape)} on {step.devices[0]} is scattered; {per_device}. The outputs are "
        f"gathered into {_shape(step.gathered_shape)} on {step.gathered_device}, where the loss is "
        f"computed; backward() sends each replica the gradient of its slice, and the replicas' "
        f"gradients of {step.parameter} are summed into the model on {step.devices[0]}."
    )
