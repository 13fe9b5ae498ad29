"""What a training run leaves in its ``--out`` folder (``train_ddp.py``, chapters 04 and 09)."""

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
