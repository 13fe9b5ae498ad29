"""Verdicts for lab check cells: say what was expected and what came back.

A check that recognises the slip behind a failure names it: ``slip`` (a sentence, or None) ends
the FAIL line, after what was expected and what came back. The ``*_slip`` functions of
``parallel_course.slips`` say which slip a result points to. ``bytes_held`` measures the memory an
object keeps alive (its tensors' storages, a view counting the storage it keeps).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import torch


class CheckFailed(AssertionError):
    """A lab check did not pass; the message says what was expected and what came back."""


def _fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    return repr(x)


def failure(what: str, problem: str, slip: str | None = None) -> CheckFailed:
    """The FAIL of a check: the problem, then the slip it points to when one was recognised."""
    return CheckFailed(f"FAIL {what}: {problem}: {slip}" if slip else f"FAIL {what}: {problem}")


def check_equal(what: str, got: Any, expected: Any, slip: str | None = None) -> None:
    """Pass when ``got == expected``; print a one-line verdict either way (``slip`` named in a FAIL)."""
    if got != expected:
        raise failure(what, f"expected {_fmt(expected)}, got {_fmt(got)}", slip)
    print(f"PASS {what}: {_fmt(got)}")


def max_abs_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.detach().double() - expected.detach().double()).abs().max().item()


def check_close(what: str, got: torch.Tensor, expected: torch.Tensor, atol: float, slip: str | None = None) -> float:
    """Pass when shapes agree and max |got - expected| <= atol. Returns the difference.

    The printed line gives the tolerance and whether the difference is within it,
    not the difference itself: its last digits depend on the machine. A FAIL names ``slip``.
    """
    if not isinstance(got, torch.Tensor):
        raise failure(what, f"expected a tensor, got {_fmt(got)}", slip)
    if got.shape != expected.shape:
        raise failure(what, f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}", slip)
    diff = max_abs_diff(got, expected)
    if not diff <= atol:  # also catches NaN
        raise failure(what, f"max |difference| = {diff:.3g}, tolerance {atol:g}", slip)
    print(f"PASS {what}: max |difference| <= {atol:g}")
    return diff


def _flat(values) -> torch.Tensor:
    """A tensor, a list of tensors or a list of numbers, as one flat float64 tensor on the CPU."""
    if isinstance(values, torch.Tensor):
        return values.detach().reshape(-1).double().cpu()
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat([v.detach().reshape(-1).double().cpu() for v in values])
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


def scale_of(got, expected, rtol: float = 1e-4) -> float | None:
    """The number s with got = s * expected (tensors, or lists of them taken together), when there is
    one: every element off by at most ``rtol`` of the largest. None when no one number fits."""
    try:
        g, e = _flat(got), _flat(expected)
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return None
    if g.shape != e.shape or not e.abs().max() > 0 or not torch.isfinite(g).all():
        return None
    scale = (g @ e / (e @ e)).item()
    largest = max(g.abs().max().item(), e.abs().max().item())
    return scale if (g - scale * e).abs().max().item() <= rtol * largest else None


def matching_slip(got, slips: dict[str, Any], atol: float) -> str | None:
    """The first of ``slips`` (what the slip is -> what it computes) whose result ``got`` equals,
    within ``atol``; None when it equals none of them."""
    for slip, value in slips.items():
        try:
            same = _flat(got).shape == _flat(value).shape and max_abs_diff(_flat(got), _flat(value)) <= atol
        except (TypeError, ValueError, AttributeError, RuntimeError):
            same = False
        if same:
            return slip
    return None


# What holding an object's tensors does not follow: classes, Python modules, functions and methods.
_NOT_FOLLOWED = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def storages_held(obj: Any, exclude: Any = ()) -> dict[int, int]:
    """{storage address: bytes} of every tensor ``obj`` holds: its attributes, followed through
    modules, optimizers, dicts, lists, tuples and sets, and a tensor's gradient (a tensor that is a
    view counts its whole storage: what it keeps alive). The tensors in ``exclude`` (and their
    gradients) are left out."""
    left_out = {t.untyped_storage().data_ptr() for t in exclude}
    found: dict[int, int] = {}
    seen: set[int] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() in left_out:
                continue
            if storage.nbytes():
                found[storage.data_ptr()] = storage.nbytes()
            if item.grad is not None:
                stack.append(item.grad)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, _NOT_FOLLOWED):
            stack.extend(vars(item).values())
    return found


def bytes_held(obj: Any, exclude: Any = ()) -> int:
    """The bytes of the tensors ``obj`` holds (``storages_held``), each storage once."""
    return sum(storages_held(obj, exclude).values())


def raised_in(error: BaseException, files: Sequence[str]) -> str:
    """The function (``Class.method``) of the student's ``files`` (names, or paths ending so) in which
    ``error`` was raised: the last of them in its traceback; "your code" when none is."""
    found, tb = "your code", error.__traceback__
    while tb is not None:
        if any(tb.tb_frame.f_code.co_filename.endswith(name) for name in files):
            found = tb.tb_frame.f_code.co_qualname
        tb = tb.tb_next
    return found
