"""The course's explorers: controls -> a plain function -> text and a figure (``base.Explorer``).

One module per explorer: ``placement`` (chapter 00), ``cost_model`` (01), ``ring`` (03),
``pipeline`` (07a), ``zero`` (08), ``layout_memory`` (11),
``planner`` (14a). Tested in tests/unit/test_explorers.py,
and each driven in a real browser by tests/browser/test_jupyterlab.py.
"""

from .cost_model import cost_model_explorer
from .layout_memory import layout_memory_explorer
from .pipeline import pipeline_explorer
from .placement import placement_explorer
from .planner import planner_explorer
from .ring import ring_allreduce_explorer
from .zero import zero_calculator

__all__ = [
    "cost_model_explorer",
    "layout_memory_explorer",
    "pipeline_explorer",
    "placement_explorer",
    "planner_explorer",
    "ring_allreduce_explorer",
    "zero_calculator",
]
