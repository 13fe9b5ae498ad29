"""Verdicts for lab check cells: say what was expected and what came back."""

from __future__ import annotations

from typing import Any

import torch


class CheckFailed(AssertionError):
    """A lab check did not pass; the message says what was expected and what came back."""


def _fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    return repr(x)


def check_equal(what: str, got: Any, expected: Any) -> None:
    """Pass when ``got == expected``; print a one-line verdict either way."""
    if got != expected:
        raise CheckFailed(f"FAIL {what}: expected {_fmt(expected)}, got {_fmt(got)}")
    print(f"PASS {what}: {_fmt(got)}")


def max_abs_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.detach().double() - expected.detach().double()).abs().max().item()


def check_close(what: str, got: torch.Tensor, expected: torch.Tensor, atol: float) -> float:
    """Pass when shapes agree and max |got - expected| <= atol. Returns the difference.

    The printed line gives the tolerance and whether the difference is within it,
    not the difference itself: its last digits depend on the machine.
    """
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"FAIL {what}: expected a tensor, got {_fmt(got)}")
    if got.shape != expected.shape:
        raise CheckFailed(f"FAIL {what}: expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}")
    diff = max_abs_diff(got, expected)
    if not diff <= atol:  # also catches NaN
        raise CheckFailed(f"FAIL {what}: max |difference| = {diff:.3g}, tolerance {atol:g}")
    print(f"PASS {what}: max |difference| <= {atol:g}")
    return diff
