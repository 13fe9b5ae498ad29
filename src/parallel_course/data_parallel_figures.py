"""Chapters 01 and 02's figures, drawn from their own computation: the bytes each machine's link
carries to average a gradient with a parameter server or a ring (``costmodel.traffic``, the
numbers chapter 01 prints), and one ``nn.DataParallel`` step as chapter 02 re-enacts it (the
chunks ``scatter`` made, the replicas, the threads that ran them as a hook recorded, the
gathered output and the gradients that ``backward()`` left in each replica and summed).

``link_loads`` and ``data_parallel_step_picture`` turn those results into what is drawn where;
the ``draw_`` functions only place it on Axes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from . import costmodel

SERVER_COLOUR = "#ffb703"
WORKER_COLOUR = "#8ecae6"
RANK_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff", "#d9d9d9"]
MB = 1e6

# --- 01: bytes per link ---------------------------------------------------------------------------


@dataclass
class Link:
    """One machine's link to the network: who it is, and the bytes it sends and receives per step."""

    name: str
    sends: float
    receives: float


def link_loads(algorithm: str, world_size: int, model_bytes: float) -> list[Link]:
    """Every machine's link in one averaging step of a ``model_bytes`` gradient over ``world_size``
    workers, from ``costmodel.traffic``: a parameter server ("ps") has the server's link first,
    then the workers'; a ring ("ring") has one link per rank."""
    traffic = costmodel.traffic(algorithm, world_size, model_bytes)
    if algorithm == "ps":
        workers = [Link(f"worker {r}", traffic.worker_sends, traffic.worker_receives) for r in range(world_size)]
        return [Link("server", traffic.server_sends, traffic.server_receives), *workers]
    return [Link(f"rank {r}", traffic.worker_sends, traffic.worker_receives) for r in range(world_size)]


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / MB:.0f} MB" if nbytes / MB >= 10 else f"{nbytes / MB:.1f} MB"


def draw_links(ax, algorithm: str, links: list[Link], widest: float) -> None:
    """Each machine on a circle round a switch, its link drawn as thick as the bytes it carries
    (``widest``: the bytes drawn 16 points wide) and labelled, outside, with what it sends and
    receives; a ring's direction as arrows from each rank to the next."""
    ax.add_patch(
        FancyBboxPatch(
            (-0.42, -0.17), 0.84, 0.34, boxstyle="round,pad=0.02", facecolor="0.85", edgecolor="0.3", zorder=2
        )
    )
    ax.text(0, 0, "switch", ha="center", va="center", fontsize=12.5, zorder=3)
    n = len(links)
    angles = [math.pi / 2 - 2 * math.pi * i / n for i in range(n)]
    for angle, link in zip(angles, links):
        x, y = 1.5 * math.cos(angle), 1.5 * math.sin(angle)
        width = 16 * (link.sends + link.receives) / widest
        ax.plot([0, x], [0, y], color="#fb8500", linewidth=width, zorder=1, solid_capstyle="butt")
        colour = SERVER_COLOUR if link.name == "server" else WORKER_COLOUR
        ax.add_patch(Circle((x, y), 0.42, facecolor=colour, edgecolor="black", zorder=2))
        ax.text(x, y, link.name.replace(" ", "\n"), ha="center", va="center", fontsize=11, zorder=3)
        # The label beside a machine on the left or right, above or below one at the top or bottom.
        side = math.cos(angle) > 0.5 or math.cos(angle) < -0.5
        ax.text(
            x + math.copysign(0.52, math.cos(angle)) if side else x,
            y if side else y + math.copysign(0.62, math.sin(angle)),
            f"out {_megabytes(link.sends)}\nin {_megabytes(link.receives)}",
            fontsize=13,
            ha=("left" if math.cos(angle) > 0 else "right") if side else "center",
            va="center",
            weight="bold" if link.name == "server" else "normal",
        )
    if algorithm == "ring":
        # The ring's direction: rank r sends to rank r+1, round and round.
        for a, b in zip(angles, angles[1:] + angles[:1]):
            ax.add_patch(
                FancyArrowPatch(
                    (1.5 * math.cos(a), 1.5 * math.sin(a)),
                    (1.5 * math.cos(b), 1.5 * math.sin(b)),
                    connectionstyle="arc3,rad=-0.25",
                    arrowstyle="-|>",
                    mutation_scale=12,
                    shrinkA=24,
                    shrinkB=24,
                    color="0.35",
                    zorder=1,
                )
            )
    ax.set(xlim=(-3.4, 3.4), ylim=(-2.5, 2.5), aspect="equal")
    ax.axis("off")


def busiest_links(model_bytes: float, world_sizes: list[int]) -> dict[str, list[float]]:
    """Per world size, the bytes (in + out) on the busiest link: the parameter server's, a
    worker's, a ring rank's."""
    curves: dict[str, list[float]] = {"parameter server's link": [], "a worker's link": [], "a ring rank's link": []}
    for n in world_sizes:
        server, worker = link_loads("ps", n, model_bytes)[:2]
        rank = link_loads("ring", n, model_bytes)[0]
        for key, link in zip(curves, (server, worker, rank)):
            curves[key].append(link.sends + link.receives)
    return curves


def traffic_figure(model_bytes: float, world_size: int, world_sizes: list[int], title: str | None = None) -> Figure:
    """A parameter server and a ring of ``world_size`` machines, their links on one scale of
    width; then the busiest link's bytes against N over ``world_sizes``: the server's grows with
    N, a ring rank's stays under 4S (2S out, 2S in)."""
    fig = Figure(figsize=(16, 6), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 0.9])
    loads = {a: link_loads(a, world_size, model_bytes) for a in ("ps", "ring")}
    widest = max(link.sends + link.receives for links in loads.values() for link in links)
    for ax, algorithm in zip(axes, ("ps", "ring")):
        draw_links(ax, algorithm, loads[algorithm], widest)
        ax.set_title(_title(algorithm, loads[algorithm]), fontsize=16)
    ax = axes[2]
    styles = {
        "parameter server's link": ("o-", SERVER_COLOUR),
        "a worker's link": ("s--", "#219ebc"),
        "a ring rank's link": ("^-", "#fb8500"),
    }
    for label, values in busiest_links(model_bytes, world_sizes).items():
        marker, colour = styles[label]
        ax.plot(world_sizes, [v / MB for v in values], marker, color=colour, label=label, linewidth=2)
    ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
    ax.set_xlabel("machines N", fontsize=14)
    ax.set_ylabel("MB per step on the link (out + in)", fontsize=14)
    ax.set_title("The busiest link against N", fontsize=16)
    ax.tick_params(labelsize=12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=12.5)
    fig.suptitle(
        title
        or f"Averaging a gradient of S = {_megabytes(model_bytes)}: the bytes on each machine's link per step "
        "(line width: out + in)",
        fontsize=16,
    )
    return fig


def _title(algorithm: str, links: list[Link]) -> str:
    n = len(links) - 1 if algorithm == "ps" else len(links)
    name = f"parameter server, {n} workers" if algorithm == "ps" else f"ring all-reduce, {n} ranks"
    return name


def describe_traffic(model_bytes: float, world_size: int, world_sizes: list[int]) -> str:
    """The text alternative: what the server's, a worker's and a rank's link carry, and the busiest
    link's bytes against N."""
    server, worker = link_loads("ps", world_size, model_bytes)[:2]
    rank = link_loads("ring", world_size, model_bytes)[0]
    curves = "; ".join(
        f"{label}: " + ", ".join(f"{_megabytes(v)} at N = {n}" for n, v in zip(world_sizes, values))
        for label, values in busiest_links(model_bytes, world_sizes).items()
    )
    return (
        f"Each machine's link to a switch, drawn as thick as the bytes it carries per step to average "
        f"a gradient of S = {_megabytes(model_bytes)} over N = {world_size}: the parameter server's link "
        f"sends {_megabytes(server.sends)} and receives {_megabytes(server.receives)}, each worker's "
        f"{_megabytes(worker.sends)} each way; in a ring every rank's link carries {_megabytes(rank.sends)} "
        f"each way. The busiest link's bytes (out + in) against N: {curves}."
    )


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


# --- 01: data vs model parallelism ----------------------------------------------------------------


@dataclass
class Split:
    """One way of splitting a step over workers: the network's layers, which of them each worker
    holds, its parameters and samples, and what crosses between workers per step (bytes)."""

    name: str
    layers: list[str]
    holds: list[list[bool]]
    parameters: list[int]
    samples: list[int]
    message: str
    message_bytes: int


def _layer_name(module) -> str:
    if hasattr(module, "in_features"):
        return f"{type(module).__name__} {module.in_features}→{module.out_features}"
    return type(module).__name__


def _count(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def parallelism_splits(net, stages, x, h) -> tuple[Split, Split]:
    """Data and model parallelism of ``net`` (an ``nn.Sequential``) over ``len(stages)`` workers,
    from chapter 01's computation: data parallelism gives every worker the whole net and a chunk
    of the batch ``x``, and averages a gradient as large as the model; model parallelism gives
    worker k the layers of ``stages[k]`` and the whole batch, and sends the activations ``h``
    (forward, and as many bytes of their gradients backward). Refuses stages that do not cut the
    net into consecutive parts, each layer held once."""
    layers = list(net)
    held = [[any(layer is m for m in stage) for layer in layers] for stage in stages]
    order = [k for k in range(len(stages)) for _ in range(sum(held[k]))]
    if [sum(column) for column in zip(*held)] != [1] * len(layers) or order != sorted(order):
        raise ValueError("the stages must cut the net into consecutive parts, each layer in one stage")
    names = [_layer_name(m) for m in layers]
    n = len(stages)
    dtype_bytes = next(net.parameters()).element_size()
    data = Split(
        name=f"data parallelism, {n} workers",
        layers=names,
        holds=[[True] * len(layers) for _ in range(n)],
        parameters=[_count(layers)] * n,
        samples=[len(chunk) for chunk in x.chunk(n)],
        message="gradients,\naveraged (all-reduce)",
        message_bytes=_count(layers) * dtype_bytes,
    )
    model = Split(
        name=f"model parallelism, {n} workers",
        layers=names,
        holds=held,
        parameters=[_count(stage) for stage in stages],
        samples=[len(x)] * n,
        message="activations forward,\ntheir gradients backward",
        message_bytes=h.numel() * h.element_size(),
    )
    return data, model


def draw_split(ax, split: Split) -> None:
    """A column per worker, its layers stacked (filled: held, faint: not held), its parameters and
    samples under it, and what crosses between workers on an arrow."""
    n, depth = len(split.holds), len(split.layers)
    xs = [3.6 * k for k in range(n)]
    for k, x in enumerate(xs):
        ax.add_patch(
            FancyBboxPatch(
                (x - 1.1, -1.45), 2.2, depth + 1.6, boxstyle="round,pad=0.05", facecolor="0.96", edgecolor="0.4"
            )
        )
        ax.text(x, depth + 0.35, f"worker {k}", ha="center", va="center", fontsize=14, weight="bold")
        for i, (name, held) in enumerate(zip(split.layers, split.holds[k])):
            y = depth - 1 - i
            ax.add_patch(
                FancyBboxPatch(
                    (x - 0.95, y + 0.1),
                    1.9,
                    0.8,
                    boxstyle="round,pad=0,rounding_size=0.08",
                    facecolor=RANK_COLOURS[k % len(RANK_COLOURS)] if held else "white",
                    edgecolor="black" if held else "0.75",
                    linestyle="-" if held else ":",
                )
            )
            ax.text(x, y + 0.5, name, ha="center", va="center", fontsize=12, color="black" if held else "0.6")
        ax.text(
            x,
            -0.75,
            f"{split.parameters[k]:,} parameters\n{split.samples[k]} samples of the batch",
            ha="center",
            va="center",
            fontsize=12,
        )
    for k, (a, b) in enumerate(zip(xs, xs[1:])):
        if all(all(holds) for holds in split.holds):
            # Every worker holds every layer: what crosses is the whole model's gradient.
            start, end = (a + 1.15, depth / 2), (b - 1.15, depth / 2)
        else:
            # The activations of worker k's last layer go into worker k+1's first.
            cut = sum(sum(holds) for holds in split.holds[: k + 1])
            start, end = (a + 0.95, depth - cut + 0.5), (b - 0.95, depth - cut - 0.5)
        ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "<|-|>", "linewidth": 1.5})
        ax.text(
            (a + b) / 2,
            max(start[1], end[1]) + 0.15,
            f"{split.message}\n{split.message_bytes:,} bytes",
            ha="center",
            va="bottom",
            fontsize=12,
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "0.6"},
            zorder=5,
        )
    ax.set_title(split.name, fontsize=16)
    ax.set(xlim=(-1.4, xs[-1] + 1.4), ylim=(-1.7, depth + 0.8))
    ax.axis("off")


def splits_figure(splits: tuple[Split, ...], title: str | None = None) -> Figure:
    fig = Figure(figsize=(14, 5.2), layout="constrained")
    for ax, split in zip(fig.subplots(1, len(splits)), splits):
        draw_split(ax, split)
    fig.suptitle(title or "Two things to split: the batch (left) or the model (right); per step", fontsize=16)
    return fig


def describe_splits(splits: tuple[Split, ...]) -> str:
    """The text alternative: per split, what each worker holds and computes on, and what it sends."""
    parts = []
    for split in splits:
        workers = "; ".join(
            f"worker {k} holds {', '.join(name for name, h in zip(split.layers, holds) if h)} "
            f"({split.parameters[k]:,} parameters) and computes on {split.samples[k]} samples"
            for k, holds in enumerate(split.holds)
        )
        message = split.message.replace("\n", " ")
        parts.append(f"{split.name}: {workers}; between them: {message}, {split.message_bytes:,} bytes per step.")
    return " ".join(parts)
