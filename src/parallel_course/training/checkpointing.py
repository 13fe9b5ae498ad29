"""The capstone's checkpoints (chapter 11c): saved with ``torch.distributed.checkpoint`` (DCP) by
parameter name, each rank writing and reading only its shards, so that a checkpoint of one layout
and world size continues in any other; in the background if asked; and on a preemption signal,
after the step the ranks agree on.

A checkpoint is a folder ``step-NNNNNN`` (the steps done) inside a ``--checkpoint-dir``; DCP writes
its ``.metadata`` last, once every rank has written its part, so a folder without one holds nothing.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

# The signals a scheduler sends before it stops a job (SLURM: scancel --signal, #SBATCH --signal).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STEP_FOLDER = re.compile(r"step-(\d+)$")


def checkpoint_step(folder: Path) -> int | None:
    """The step a checkpoint folder holds (step-000004 holds step 4), None if it holds none:
    torch.distributed.checkpoint writes .metadata last, once every rank has written its part."""
    match = STEP_FOLDER.search(folder.name)
    return int(match.group(1)) if match and (folder / ".metadata").is_file() else None


def latest_checkpoint(path: Path) -> Path | None:
    """A checkpoint folder itself, or the newest complete checkpoint inside a --checkpoint-dir."""
    if checkpoint_step(path) is not None:
        return path
    found = [f for f in path.glob("step-*") if checkpoint_step(f) is not None] if path.is_dir() else []
    return max(found, key=checkpoint_step, default=None)


def training_state(model, optimizer, step: int, data: torch.Generator, weights_only: bool = False) -> dict:
    """What a checkpoint holds, by parameter name: the same names in every layout, each rank
    saving and loading only its shard. The data generator's state is the position in the data
    (every rank draws every global batch, so it is the same on all)."""
    if weights_only:
        model_state, _ = get_state_dict(model, [])
        state = {"model": model_state}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        # Hyperparameters come from this run's command line, not the checkpoint: a pipeline stage's
        # optimizer lists only its own parameters there.
        optim_state.pop("param_groups")
        state = {"model": model_state, "optim": optim_state}
    state["train"] = {"step": torch.tensor(step), "data_rng": data.get_state()}
    return state


def load_checkpoint(folder: Path, model, optimizer, data: torch.Generator, weights_only: bool) -> None:
    """Fill the model (and the optimizer, unless weights_only, and the data position) from a
    checkpoint, each rank reading its shards, whatever layout and world size wrote it."""
    state = training_state(model, optimizer, 0, data, weights_only)
    dcp.load(state, checkpoint_id=folder)
    if weights_only:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        state["optim"]["param_groups"] = get_state_dict(model, optimizer)[1]["param_groups"]
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    data.set_state(state["train"]["data_rng"])


class Preemption:
    """Turns SIGTERM or SIGUSR1 into "save and stop after this step". The handler only notes the
    signal; at the end of each step the ranks agree (a signal may reach them at different moments)."""

    def __init__(self, device: torch.device):
        self.received, self.device = 0, device
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, self.note)

    def note(self, signum, frame):
        self.received = signum

    def agreed(self) -> int:
        """The signal any rank received (0 if none): the same answer on every rank."""
        # On the training's device: nccl reduces only GPU tensors.
        flag = torch.tensor([self.received], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


class Checkpoints:
    """The saves of a run into folder (None: no checkpoints): every `every` steps, at the end (step
    `steps`), and on a preemption; in the background if asked (dcp.async_save)."""

    def __init__(self, folder: Path | None, every: int | None, steps: int, background: bool, device: torch.device):
        self.folder, self.steps, self.background = folder, steps, background
        self.every, self.pending, self.saves = every or steps, None, []
        self.preemption = Preemption(device) if folder is not None else None
        # Made now, by every rank together, not in the first save's time.
        self.group = background_group() if background else None

    def after_step(self, step: int, model, optimizer, data) -> int:
        """Save if step (the steps done) is due; returns the signal that stops the run, or 0."""
        if self.preemption is None:
            return 0
        # A signal in the last step stops nothing: the run ends with this step anyway, and writes its
        # metrics (a requeued job would find nothing left to train).
        stop = self.preemption.agreed() if step < self.steps else 0
        if step % self.every == 0 or step == self.steps or stop:
            self.save(step, model, optimizer, data)
        if stop:
            self.wait()
            if dist.get_rank() == 0:
                sys.stdout.write(
                    f"preempted by {signal.Signals(stop).name} after step {step} of {self.steps}: saved "
                    f"{self.folder / f'step-{step:06d}'}; continue with --resume {self.folder}\n"
                )
        return stop

    def save(self, step: int, model, optimizer, data) -> None:
        """Save to folder/step-NNNNNN, after the previous background save has finished."""
        self.wait()
        start = time.perf_counter()
        state = training_state(model, optimizer, step, data, weights_only=step == 0)
        folder = self.folder / f"step-{step:06d}"
        if self.background:
            # Copies the state to memory now, writes it from a thread: training goes on meanwhile.
            self.pending = dcp.async_save(state, checkpoint_id=folder, process_group=self.group)
        else:
            dcp.save(state, checkpoint_id=folder)
        waited = time.perf_counter() - start
        self.saves.append({"step": step, "training_waited_s": waited})
        if dist.get_rank() == 0:
            how = "in the background" if self.background else "blocking"
            sys.stdout.write(f"checkpoint of step {step} ({how}): training waited {waited:.3f} s\n")

    def wait(self) -> None:
        """Until the background save is written: before the next one, and before the process ends."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None


# The group of the background saves, made once per process group.
_BACKGROUND: dict = {"world": None, "group": None}


def background_group():
    """A background save runs collectives from its own thread: on a group of its own, or they would
    interleave with the training's on the same group and hang. Gloo, even beside nccl: the save
    plans travel between CPUs. One per process group, whatever the number of runs in it."""
    world = dist.distributed_c10d._get_default_group()
    if _BACKGROUND["world"] is not world:
        _BACKGROUND["world"], _BACKGROUND["group"] = world, dist.new_group(backend="gloo")
    return _BACKGROUND["group"]
