"""Helpers for the Parallel PyTorch course.

Small modules, each doing what its name says:

- ``launch``        set a notebook up so that ``!torchrun`` cells behave the same everywhere
- ``machine``       what this machine offers: cores, GPUs, backends, a sensible world size
- ``costmodel``     predicted step time and speedup of data-parallel training (chapter 01)
- ``data_parallel`` DataParallel's four steps re-enacted on threads (chapter 02)
- ``checks``        clear verdicts for lab check cells
- ``labgen``        labs generated from solutions (nbgrader markers)
- ``widgets``       thin ipywidgets layers over the functions above
"""

from .launch import setup_notebook

__all__ = ["setup_notebook"]
__version__ = "0.1.0"
