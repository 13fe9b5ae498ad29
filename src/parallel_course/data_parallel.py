"""DataParallel's four steps re-enacted on threads, so that they can be watched on any machine.

``nn.DataParallel`` runs one training step as

1. **scatter**   split the batch into one chunk per device (``torch.chunk`` sizes);
2. **replicate** copy the module onto every device, again at every step;
3. **parallel_apply** run each replica on its chunk, one Python thread per device;
4. **gather**    concatenate the outputs on the output device (device 0);

and in ``backward()`` it sums (reduce-adds) the replicas' gradients into the original module.

On a machine without GPUs, DataParallel does none of this (``device_ids == []``: it calls the
module once on the whole batch), and ``torch.nn.parallel.scatter``/``replicate``/``gather``
refuse CPU tensors. The functions here do the same steps by hand: on CPU the "devices" are
labels ``"cpu:0"``, ``"cpu:1"``, ... (one thread each, all on the same CPU); with GPUs they can
be real ``"cuda:k"`` devices. The result must equal one full-batch forward/backward, which is
what makes data parallelism correct: the gradient of a mean loss over the batch is the sum of
the gradients that flow back into each chunk.
"""

from __future__ import annotations

import copy
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .checks import check_close, matching_slip

Devices = Sequence[str]
PHASES = ("replicate", "scatter", "apply", "gather", "backward", "reduce")
OVERHEAD_PHASES = ("replicate", "scatter", "gather", "reduce")  # work a single device never does
COMPUTE_PHASES = ("apply", "backward")


# --------------------------------------------------------------------------- arguments


def cpu_devices(n: int) -> list[str]:
    """Labels for ``n`` pretend devices on the CPU: ``["cpu:0", ..., "cpu:{n-1}"]``."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of replicas (world size) must be at least 1, got {n!r}")
    return [f"cpu:{i}" for i in range(n)]


def check_devices(devices: Devices) -> list[str]:
    """The devices as strings; ValueError for an empty list, a duplicate or an unknown device.

    Known devices are CPU labels ``cpu:<k>`` (any k: they only name a thread) and
    ``cuda:<k>`` for a GPU that exists here.
    """
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    names = [str(d) for d in devices]
    if not names:
        raise ValueError("number of replicas (world size) must be at least 1, got 0 devices")
    n_gpus = torch.cuda.device_count()
    for name in names:
        kind, _, index = name.partition(":")
        ok = index.isdigit() and (kind == "cpu" or (kind == "cuda" and int(index) < n_gpus))
        if not ok:
            raise ValueError(
                f"unknown device {name!r}: use 'cpu:<k>' labels or 'cuda:<k>' with k < {n_gpus}"
                f" (GPUs visible here: {n_gpus})"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"each device may appear only once, got {names}")
    return names


def torch_device(name: str) -> torch.device:
    """Where tensors for a device label really live: all ``cpu:<k>`` labels share the CPU."""
    return torch.device("cpu") if name.startswith("cpu") else torch.device(name)


def _as_devices(devices: int | Devices) -> list[str]:
    return cpu_devices(devices) if isinstance(devices, int) else check_devices(devices)


# --------------------------------------------------------------------------- the four steps


def chunk_sizes(batch: int, n: int) -> list[int]:
    """Chunk sizes DataParallel uses to split ``batch`` samples over ``n`` devices.

    DataParallel scatters with ``torch.chunk``: every chunk has ``ceil(batch / n)`` samples
    and the last one gets what is left, so 100 over 3 gives ``[34, 34, 32]`` (not the
    ``[34, 33, 33]`` of ``torch.tensor_split``). Some sizes give *fewer* chunks than
    devices: 6 over 4 is ``[2, 2, 2]``, and DataParallel then uses only the first 3 devices.
    A batch smaller than ``n`` is rejected here (DataParallel would silently idle devices).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of replicas (world size) must be at least 1, got {n!r}")
    if batch < n:
        raise ValueError(f"batch of {batch} samples is smaller than the {n} replicas")
    size = -(-batch // n)  # ceil
    return [min(size, batch - start) for start in range(0, batch, size)]


def scatter(inputs: torch.Tensor, devices: int | Devices) -> list[torch.Tensor]:
    """Split ``inputs`` along dim 0 into ``chunk_sizes`` pieces, chunk i onto device i.

    Returns one chunk per *used* device (possibly fewer than given, see ``chunk_sizes``).
    """
    devices = _as_devices(devices)
    sizes = chunk_sizes(inputs.shape[0], len(devices))
    return [c.to(torch_device(d)) for c, d in zip(inputs.split(sizes), devices)]


def replicate(module: nn.Module, devices: int | Devices) -> list[nn.Module]:
    """One independent copy of ``module`` per device, with no gradients yet.

    DataParallel does this at *every* forward call (its replicas live for one step), which
    is one reason it is slow. These replicas are deep copies: their parameters are new leaf
    tensors, so ``backward()`` leaves each replica's share of the gradient in its own
    ``.grad``, to be summed by ``reduce_gradients``. (Real DataParallel replicates with a
    differentiable broadcast, so autograd does that sum itself.) Buffer updates made in a
    replica (BatchNorm running stats) are discarded.
    """
    replicas = []
    for d in _as_devices(devices):
        replica = copy.deepcopy(module).to(torch_device(d))
        for p in replica.parameters():
            p.grad = None
        replicas.append(replica)
    return replicas


def parallel_apply(
    replicas: Sequence[nn.Module], chunks: Sequence[torch.Tensor], devices: int | Devices
) -> list[torch.Tensor]:
    """Run ``replicas[i](chunks[i])`` on its own thread (named after device i); outputs in order.

    Like DataParallel: one Python thread per device, all in one process, so Python code in
    the forward pass takes turns on the GIL. Grad mode is per thread in PyTorch, so each
    thread is told whether the caller records gradients. An exception in a thread is re-raised
    here (the first device's, if several fail), naming the device.
    """
    devices = _as_devices(devices)[: len(chunks)]
    if len(replicas) < len(chunks):
        raise ValueError(f"{len(chunks)} chunks but only {len(replicas)} replicas")
    outputs: list[torch.Tensor | None] = [None] * len(chunks)
    errors: list[BaseException | None] = [None] * len(chunks)
    grad_enabled = torch.is_grad_enabled()

    def worker(i: int) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled):
                if devices[i].startswith("cuda"):
                    with torch.cuda.device(torch_device(devices[i])):
                        outputs[i] = replicas[i](chunks[i])
                else:
                    outputs[i] = replicas[i](chunks[i])
        except BaseException as e:  # re-raised in the caller's thread
            errors[i] = e

    threads = [threading.Thread(target=worker, args=(i,), name=f"replica on {devices[i]}") for i in range(len(chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for device, e in zip(devices, errors):
        if e is not None:
            raise RuntimeError(f"replica on {device} failed: {type(e).__name__}: {e}") from e
    return outputs  # type: ignore[return-value]


def gather(outputs: Sequence[torch.Tensor], output_device: str) -> torch.Tensor:
    """Concatenate the replicas' outputs along dim 0 on ``output_device`` (DataParallel: device 0).

    Differentiable: ``backward()`` from the gathered output sends each slice of the gradient
    back to the replica that produced it.
    """
    target = torch_device(check_devices([output_device])[0])
    return torch.cat([o.to(target) for o in outputs], dim=0)


def reduce_gradients(module: nn.Module, replicas: Sequence[nn.Module]) -> None:
    """Add the sum of the replicas' gradients into ``module``'s ``.grad`` (reduce-add).

    Accumulates like ``backward()`` does, so call ``zero_grad()`` between steps as usual.
    Because the loss was computed on the gathered output of the whole batch, the sum of the
    replicas' gradients *is* the full-batch gradient: no averaging over replicas.
    """
    replica_params = [dict(r.named_parameters()) for r in replicas]
    for name, param in module.named_parameters():
        grads = [params[name].grad for params in replica_params]
        grads = [g.to(param.device) for g in grads if g is not None]
        if not grads:
            continue
        total = torch.stack(grads).sum(dim=0)
        param.grad = total if param.grad is None else param.grad + total


# --------------------------------------------------------------------------- one step


@dataclass
class StepResult:
    outputs: torch.Tensor  # gathered, on the output device
    loss: torch.Tensor
    chunk_sizes: list[int]
    replicas: list[nn.Module]


def data_parallel_step(
    module: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    devices: int | Devices,
) -> StepResult:
    """Forward and backward of one DataParallel step, done by hand.

    ``devices`` is a list of device names, or a number n of CPU "devices" ``cpu:0..n-1``.
    Afterwards ``module``'s ``.grad`` holds the gradient (accumulated, as ``backward()``
    would); take the optimizer step as usual.
    """
    devices = _as_devices(devices)
    replicas = replicate(module, devices)
    chunks = scatter(inputs, devices)
    outputs = gather(parallel_apply(replicas, chunks, devices), devices[0])
    loss = loss_fn(outputs, targets.to(outputs.device))
    loss.backward()
    reduce_gradients(module, replicas[: len(chunks)])
    return StepResult(outputs.detach(), loss.detach(), [len(c) for c in chunks], replicas)


def full_batch_step(
    module: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The reference: one forward/backward on the whole batch, on a copy of ``module``.

    Returns (outputs, loss, gradients by parameter name); ``module`` is left untouched.
    """
    reference = copy.deepcopy(module)
    reference.zero_grad(set_to_none=True)
    outputs = reference(inputs)
    loss = loss_fn(outputs, targets)
    loss.backward()
    grads = {n: p.grad.detach() for n, p in reference.named_parameters() if p.grad is not None}
    return outputs.detach(), loss.detach(), grads


# --------------------------------------------------------------------------- checks for lab 02


def check_close_or_slip(
    what: str,
    got: torch.Tensor,
    expected: torch.Tensor,
    atol: float,
    slips: dict[str, torch.Tensor],
    slip: str | None = None,
) -> None:
    """``checks.check_close``, and a FAIL that names the slip when ``got`` misses ``expected`` but
    equals what a known slip computes (``slips``: what the slip is -> what it gives); else ``slip``,
    a slip recognised another way (or None)."""
    known = matching_slip(got, slips, atol)
    # Nothing returned: a check cell ending in this call would show the difference, and nbgrader
    # takes a number shown by a graded cell for its score.
    check_close(what, got, expected, atol, slip=f"that is {known}" if known else slip)


# --------------------------------------------------------------------------- what it costs


def _sync(devices: Devices) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not its launch."""
    for d in devices:
        if d.startswith("cuda"):
            torch.cuda.synchronize(torch_device(d))


def time_phases(
    module: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    devices: int | Devices,
    repeats: int = 5,
) -> dict[str, float]:
    """Median seconds per phase of ``data_parallel_step`` over ``repeats`` steps (after one
    warm-up), plus ``"full batch"``: one forward/backward of ``module`` on the whole batch.

    Medians, because a single step can be slowed by anything else the machine does.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    devices = _as_devices(devices)
    samples: dict[str, list[float]] = {p: [] for p in (*PHASES, "full batch")}

    def clock() -> float:
        _sync(devices)
        return time.perf_counter()

    for rep in range(repeats + 1):  # rep 0 warms up allocators and thread pools
        t0 = clock()
        replicas = replicate(module, devices)
        t1 = clock()
        chunks = scatter(inputs, devices)
        t2 = clock()
        outs = parallel_apply(replicas, chunks, devices)
        t3 = clock()
        out = gather(outs, devices[0])
        t4 = clock()
        loss_fn(out, targets.to(out.device)).backward()
        t5 = clock()
        reduce_gradients(module, replicas[: len(chunks)])
        t6 = clock()
        module.zero_grad(set_to_none=True)
        x, y = inputs.to(torch_device(devices[0])), targets.to(torch_device(devices[0]))
        t7 = clock()
        loss_fn(module(x), y).backward()
        t8 = clock()
        module.zero_grad(set_to_none=True)
        if rep:
            for phase, dt in zip(
                (*PHASES, "full batch"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t8 - t7)
            ):
                samples[phase].append(dt)
    return {phase: statistics.median(ts) for phase, ts in samples.items()}


def overhead_and_compute(times: dict[str, float]) -> tuple[float, float]:
    """(seconds of replicate + scatter + gather + reduce, seconds of forward + backward)."""
    return sum(times[p] for p in OVERHEAD_PHASES), sum(times[p] for p in COMPUTE_PHASES)


def format_ms(seconds: float) -> str:
    """A duration in milliseconds, always: '0.09 ms', '12.34 ms'.

    One fixed unit, so that tables line up and a number near a unit boundary never changes
    its unit from one run to the next.
    """
    return f"{seconds * 1e3:.2f} ms"
