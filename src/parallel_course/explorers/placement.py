"""Chapter 00: GPUs on a node and processes to start -> the backend and device of each rank."""

from __future__ import annotations

import ipywidgets as widgets

from .. import machine
from .base import Explorer


class PlacementExplorer(Explorer):
    """Sliders for GPUs and processes; ``machine.placement`` for each rank."""

    def __init__(self, num_gpus: int = 0, world_size: int = 2):
        common = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="420px"))
        super().__init__(
            {
                "num_gpus": widgets.IntSlider(value=num_gpus, min=0, max=8, description="GPUs on the node", **common),
                "world_size": widgets.IntSlider(value=world_size, min=1, max=8, description="processes", **common),
            }
        )

    def summary(self) -> str:
        return "\n".join(machine.placement(**self.values))

    def __repr__(self) -> str:
        return f"PlacementExplorer(gpus={self.values['num_gpus']}, processes={self.values['world_size']})"


def placement_explorer(num_gpus: int = 0, world_size: int = 2) -> PlacementExplorer:
    """Sliders for GPUs and processes; shows which backend and device each rank gets."""
    return PlacementExplorer(num_gpus, world_size)
