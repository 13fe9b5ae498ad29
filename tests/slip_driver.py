"""Run one lab checker's main() once per variant of the student's module, in one launch.

    torchrun --standalone --nproc_per_node=2 tests/slip_driver.py CHECKER.py STUDENT VARIANT ... \
        [--once FN ...] [--set NAME=INTEGER ...]

(or its two processes started by tests/slip_injection.py's launch_two, without torchrun's agent).

CHECKER.py is a lab's checker script, STUDENT the module it imports the student's code from
(``lab11_zero3``), each VARIANT a module beside it with the same names (the solution with a slip
injected). The group is joined once; before each main() the checker's names that came from
STUDENT are pointed at the variant's, and its ``setup`` returns the device already joined with.
A function named by --once runs once and its result is reused (a reference computed from the same
data every time). --set changes a constant of the checker (fewer steps: the slips show in the
first). Rank 0 prints one JSON line per variant: its name, main()'s return code and
what main() wrote, or the exception it raised.
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
import traceback

import torch.distributed as dist


def once(function):
    """``function``, computed at its first call and its result returned ever after."""
    results = []

    def run(*args, **kwargs):
        if not results:
            results.append(function(*args, **kwargs))
        return results[0]

    return run


def point_at(checker, student, variant) -> None:
    """Every name of ``checker`` bound to ``student`` or one of its attributes, rebound to ``variant``'s."""
    for name, value in list(vars(checker).items()):
        if value is student:
            setattr(checker, name, variant)
        elif hasattr(student, name) and getattr(student, name) is value:
            setattr(checker, name, getattr(variant, name))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checker")
    parser.add_argument("student")
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--once", nargs="*", default=[])
    parser.add_argument("--set", nargs="*", default=[])
    args = parser.parse_args()
    folder = os.path.dirname(os.path.abspath(args.checker))
    sys.path.insert(0, folder)
    checker = importlib.import_module(os.path.splitext(os.path.basename(args.checker))[0])
    student = importlib.import_module(args.student)
    device = checker.setup()
    checker.setup = lambda *a, **k: device
    for assignment in args.set:
        name, value = assignment.split("=")
        setattr(checker, name, int(value))
    for name in args.once:
        setattr(checker, name, once(getattr(checker, name)))
    for name in args.variants:
        variant = importlib.import_module(name)
        point_at(checker, student, variant)
        student = variant
        written = io.StringIO()
        try:
            with contextlib.redirect_stdout(written):
                code, error = checker.main(), None
        except Exception:
            code, error = None, traceback.format_exc(limit=-3)
        if dist.get_rank() == 0:
            print(json.dumps({"variant": name, "code": code, "output": written.getvalue(), "error": error}), flush=True)
    checker.teardown()


if __name__ == "__main__":
    main()
