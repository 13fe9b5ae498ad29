"""Which importable functions and classes pass a lab's in-kernel checks in place of its answer.

    python tests/course/lab_leaks.py --work DIR [--plant MODULE.py ...] SOLUTION.ipynb ... > result.json

An answer is a top-level function or class of a solution notebook that holds a ``### BEGIN
SOLUTION`` region. The notebook's in-kernel code cells (never the ones that launch processes) run
once, in a forked process; before an answer's cell, a trial is forked that runs the rest with a
probe in the answer's place. At the probe's first call, each of these is tried from that very state
(a forked child per try, killed after a time limit; one that raises at once when called here with
copies of the arguments needs no child):

1. the solution itself: it runs as far as the cells go without a launch's files (the checks);
2. a stub that raises NotImplementedError: if it runs as far, no in-kernel cell checks this answer
   (its checks launch processes) and the answer is left out;
3. every function and class that a lab can import: every module of ``parallel_course``, every
   ``scripts/*.py`` that is safe to import (nothing but imports, definitions, assignments and a
   ``__main__`` block at its top level), and each ``--plant`` module (a test plants one to show that
   the search finds an importable answer). A candidate is tried whatever its name, if it accepts as
   many positional arguments as the answer requires; it passes when it runs as far as the solution.

With a process group started before the first call, a forked child cannot run the cells on: the
candidates that do not raise at the first call run again from the answer's cell.

The JSON printed says, per solution and answer, whether it is checked in-kernel, how many
candidates were tried, which passed, and how long it took; when it is not, why: left to launches by
design (``ran_as_designed``), or a trial that broke (a cell that names the answer raised before its
first call, or the solution could not be defined), which tried nothing and is no evidence of no
leak. Everything runs with DIR as the working directory: nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import inspect
import io
import json
import os
import pkgutil
import re
import select
import signal
import sys
import tempfile
import threading
import time
from copy import deepcopy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
# A cell that launches processes: too slow to run once per candidate, and not in-kernel anyway.
LAUNCHES = re.compile(r"\btorchrun\(|\brun_bounded\(|\bsubprocess\.|^\s*!", re.M)
WRITEFILE = re.compile(r"^%%writefile( -a)? (\S+)\s*$")
# The answer is looked up here by the replaced cell, in the kernel or in a file the kernel imports.
SLOT = "__lab_leak_candidate__"
REPLACEMENT = f"{{name}} = __import__('builtins').{SLOT}"


# --- the notebook's cells and answers ---------------------------------------------------------


def code_cells(solution: Path) -> list[str]:
    nb = json.loads(solution.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def split_magic(source: str) -> tuple[tuple[str, bool] | None, str]:
    """(``%%writefile``'s path and whether it appends, or None), and the Python code, line numbers kept."""
    first, _, rest = source.partition("\n")
    match = WRITEFILE.match(first)
    if match:
        return (match.group(2), bool(match.group(1))), "\n" + rest
    return None, source


def region_lines(code: str) -> set[int]:
    """Line numbers (1-based) inside solution regions."""
    inside, lines = False, set()
    for number, line in enumerate(code.split("\n"), start=1):
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside:
            lines.add(number)
    return lines


def required_positional(node: ast.AST) -> int:
    """How many positional arguments a call of this function (or class) must pass."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        return required_positional(init) - 1 if init else 0
    args = node.args
    return len(args.posonlyargs) + len(args.args) - len(args.defaults)


def answers(cells: list[str]) -> list[dict]:
    """Every top-level function or class that holds (part of) a solution region, cell by cell. An answer
    in a file is defined with the file as its cell leaves it (``%%writefile -a``: the parts before too)."""
    found, files = [], {}
    for index, source in enumerate(cells):
        magic, code = split_magic(source)
        if magic:
            path, append = magic
            files[path] = (files.get(path, "") if append else "") + code
        if "### BEGIN SOLUTION" not in source:
            continue
        inside = region_lines(code)
        for node in ast.parse(code).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if inside & set(range(first, node.end_lineno + 1)):
                found.append(
                    {
                        "cell": index,
                        "name": node.name,
                        "lines": (first, node.end_lineno),
                        "positional": required_positional(node),
                        "in_file": magic is not None,
                        "file": magic[0] if magic else None,
                        "code": files[magic[0]] if magic else code,
                        "definition": "\n".join(code.split("\n")[first - 1 : node.end_lineno]),
                    }
                )
    return found


def replaced(source: str, answer: dict | None) -> str:
    """The cell with ``answer``'s definition replaced by the candidate in the slot."""
    if answer is None:
        return source
    lines = source.split("\n")
    first, last = answer["lines"]
    lines[first - 1 : last] = [REPLACEMENT.format(name=answer["name"])]
    return "\n".join(lines)


def run_cell(source: str, namespace: dict) -> None:
    """One cell as the kernel would run it: ``%%writefile`` writes its file, anything else is Python."""
    magic, code = split_magic(source)
    if magic:
        path, append = magic
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a" if append else "w") as f:
            f.write(code[1:] + "\n")
        return
    exec(compile(code, "<lab cell>", "exec"), namespace)


# --- what a lab can import ---------------------------------------------------------------------


def safe_to_import(path: Path) -> bool:
    """Nothing runs at import: imports, definitions, assignments, a docstring, a ``__main__`` block."""
    quiet = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    for node in ast.parse(path.read_text()).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        main_block = isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        if not (isinstance(node, quiet) or docstring or main_block):
            return False
    return True


def load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def importable_modules(planted: list[Path]) -> tuple[dict[str, object], dict[str, str]]:
    """{label: module} of everything a lab can import, and {label: why not} of what cannot be."""
    import parallel_course

    modules, refused = {}, {}
    for info in pkgutil.walk_packages(parallel_course.__path__, "parallel_course."):
        modules[info.name] = importlib.import_module(info.name)
    for path in sorted(SCRIPTS.glob("*.py")):
        label = f"scripts/{path.name}"
        if not safe_to_import(path):
            refused[label] = "runs code when imported (no __main__ guard)"
            continue
        try:
            modules[label] = load_file(path, f"lab_leak_{path.stem}")
        except Exception as error:
            refused[label] = f"fails to import: {type(error).__name__}: {error}"
    for path in planted:
        modules[f"planted:{path.name}"] = load_file(path, f"lab_leak_planted_{path.stem}")
    return modules, refused


def candidates(modules: dict[str, object]) -> list[tuple[str, object, inspect.Signature]]:
    """(label, object, signature) of every function and class defined in those modules."""
    seen, found = set(), []
    for label, module in modules.items():
        for name, obj in vars(module).items():
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or id(obj) in seen:
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            try:
                signature = inspect.signature(obj)
            except (TypeError, ValueError):
                continue
            seen.add(id(obj))
            found.append((f"{label}:{name}", obj, signature))
    return found


def accepts(signature: inspect.Signature, positional: int) -> bool:
    try:
        signature.bind(*range(positional))
    except TypeError:
        return False
    return True


# --- trying every candidate from the answer's first call ---------------------------------------
#
# A lab process runs the solution's cells from the top. Before the cell of each answer it forks a
# trial process that runs the rest of the cells with a probe in the answer's place. At the probe's
# first call, the trial forks one child per candidate: the child's probe hands the call (and every
# later one) to its candidate, and the child runs on to the end of the cells. Nothing is run twice
# and nothing is copied: each child starts from the very state the solution's first call saw.


PR_SET_PDEATHSIG = 1


def fork_child() -> int:
    """``os.fork()``, with the child in a process group of its own (killed with all it started),
    killed too when its parent ends (so that no descendant outlives the search, however deep), and
    its output discarded."""
    sys.stdout.flush()
    sys.stderr.flush()
    # What the parent holds now is the child's too, and it lives on in the parent: the cyclic garbage
    # collector need never walk it again in the child. Walking it there costs a second per full
    # collection (every module the search imported, every candidate; lab 09's teardown() collects
    # once per trial) and copies every page it touches.
    gc.freeze()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            # The parent ended before the line above took effect.
            os._exit(1)
        os.setpgid(0, 0)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
    return pid


def wait_child(pid: int, limit: float) -> int | None:
    """The child's exit code, or None when it ran past ``limit`` seconds (then it is killed)."""
    handle = os.pidfd_open(pid)
    try:
        finished = bool(select.select([handle], [], [], limit)[0])
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(handle)
    return os.waitstatus_to_exitcode(status) if finished else None


def run_cells(cells: list[str], namespace: dict) -> int:
    """How many of ``cells`` run without an exception, in order (all of them, or up to the first that
    raises)."""
    return run_cells_until(cells, namespace)[0]


def run_cells_until(cells: list[str], namespace: dict) -> tuple[int, BaseException | None]:
    """How many of ``cells`` run without an exception, and the exception that stopped them (None when
    all ran)."""
    for done, source in enumerate(cells):
        try:
            run_cell(source, namespace)
        except BaseException as error:
            return done, error
    return len(cells), None


def raise_not_implemented(*args, **kwargs):
    raise NotImplementedError()


class Probe:
    """What the trial puts in the answer's place. At its first call it tries every candidate in a
    forked child (which returns the candidate's result and runs on); the trial then reports and
    ends. Afterwards, in a child, every call goes straight to that child's candidate."""

    def __init__(self, trials: list[tuple[str, object]], report: Path):
        self.trials, self.report, self.target = trials, report, None

    def __call__(self, *args, **kwargs):
        if self.target is not None:
            return self.target(*args, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            self.finish({"why": "first called on a thread other than the main one: no fork from there"})
        if group_started():
            self.first_call_only(args, kwargs)
        verdicts, limit = {}, 60.0
        for label, candidate in self.trials:
            began = time.perf_counter()
            if label not in (SOLUTION, STUB) and raises_on_copies(candidate, args, kwargs):
                # Most candidates fail at once, called as the answer first was: no child for those.
                verdicts[label] = (-1, round(time.perf_counter() - began, 3))
                continue
            pid = fork_child()
            if pid == 0:
                self.target = candidate
                return candidate(*args, **kwargs)
            verdicts[label] = (wait_child(pid, limit), round(time.perf_counter() - began, 3))
            if label == SOLUTION:
                # The solution's run sets the time limit of the others', with room to spare.
                limit = 1 + 5 * (time.perf_counter() - began)
        self.finish({"verdicts": verdicts})

    def first_call_only(self, args, kwargs) -> None:
        """With a process group started, a forked child cannot run the cells on (its collectives wait for
        threads that fork left behind), but it can make the first call: the candidates that raise there
        fail (-1 cells); those that return are run again from the answer's cell by the lab process."""
        verdicts, rerun = {}, []
        for label, candidate in self.trials:
            began = time.perf_counter()
            # Here, with copies, the group works: a candidate that raises at once needs no child (one that
            # is slow still gets one, and its rerun).
            if label not in (SOLUTION, STUB) and raises_on_copies(candidate, args, kwargs, slow_fails=False):
                verdicts[label] = (-1, round(time.perf_counter() - began, 3))
                continue
            pid = fork_child()
            if pid == 0:
                try:
                    candidate(*args, **kwargs)
                except BaseException:
                    os._exit(1)
                os._exit(0)
            # A child that hangs waits in a collective of the group it cannot use: run it again too.
            if label == SOLUTION or wait_child(pid, 2) in (0, None):
                rerun.append(label)
            else:
                verdicts[label] = (-1, round(time.perf_counter() - began, 3))
        self.finish({"verdicts": verdicts, "rerun": rerun})

    def finish(self, result: dict) -> None:
        """Write what the trial found and end it (never returns to the cells)."""
        self.report.write_text(json.dumps(result))
        os._exit(0)


SOLUTION, STUB = "(the solution)", "(a stub that raises NotImplementedError)"
# Why an answer is not checked in the kernel. These two are by design (its checks launch processes;
# the text comparison covers it); any other reason means its trial did not run as it should.
NOT_CALLED = "not called by any in-kernel cell (its checks launch processes)"
UNUSED = "its in-kernel cells pass without it (its checks launch processes)"
BROKE = "the trial broke"


def ran_as_designed(entry: dict) -> bool:
    """Whether an answer's trial ran as it should: checked, or left to launches by design. A trial that
    broke, ran out of time, was not reached or saw the solution fail tried nothing: not "no leak"."""
    return entry["checked"] or entry["why"].startswith((NOT_CALLED, UNUSED))


def copied(value):
    """A deep copy; a tensor that autograd made (no deepcopy for those) as a fresh leaf."""
    import torch

    if isinstance(value, torch.Tensor) and value.grad_fn is not None:
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(copied(v) for v in value)
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    return deepcopy(value)


class TimeUp(BaseException):
    """A call ran past its time (a BaseException: a candidate's own ``except Exception`` misses it)."""


def _time_up(signum, frame):
    raise TimeUp()


@contextlib.contextmanager
def restored():
    """Undo what a call in this process may change outside its arguments: paths, environment, folder,
    random states, signal handlers, output, a process group it started. A call that ends the group the
    cells started is an error: the cells could not go on."""
    import random

    import torch
    import torch.distributed as dist

    group = dist.group.WORLD if group_started() else None
    path, environ, folder = sys.path[:], dict(os.environ), os.getcwd()
    rng, torch_rng, threads = random.getstate(), torch.get_rng_state(), torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        now = dist.group.WORLD if group_started() else None
        if now is not None and now is not group:
            dist.destroy_process_group()
        os.chdir(folder)
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)
        random.setstate(rng)
        torch.set_rng_state(torch_rng)
        torch.set_num_threads(threads)
        if group is not None and now is not group:
            raise RuntimeError("a candidate ended the process group the cells started")


def raises_on_copies(candidate, args, kwargs, limit: float = 2.0, slow_fails: bool = True) -> bool:
    """Whether ``candidate`` raises (or, with ``slow_fails``, runs past ``limit`` seconds) called here
    with copies of the answer's first arguments. False when they cannot be copied: then a child must
    tell."""
    try:
        args, kwargs = copied((args, kwargs))
    except Exception:
        return False
    with restored():
        signal.signal(signal.SIGALRM, _time_up)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            candidate(*args, **kwargs)
        except TimeUp:
            return slow_fails
        except BaseException:
            return True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return False


def group_started() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def solution_object(answer: dict, namespace: dict):
    """The solution's own function or class, defined as its cell defines it: in the kernel's variables
    (the state just before its cell), or in the namespace of the file the cell writes."""
    if answer["in_file"]:
        # As the script that imports the file finds what the file imports: its folder first on the path
        # (lab 05's BucketedDDP imports broadcast_from_rank0 from the file beside it).
        scope, folder = {"__name__": "lab_leak_solution"}, str(Path(answer["file"]).parent.resolve())
        sys.path.insert(0, folder)
        try:
            exec(compile(answer["code"], "<solution file>", "exec"), scope)
        finally:
            sys.path.remove(folder)
    else:
        # The cell up to the end of the definition: what comes before it (imports) is what it uses.
        scope = namespace
        exec(compile("\n".join(answer["code"].split("\n")[: answer["lines"][1]]), "<solution>", "exec"), scope)
    return scope[answer["name"]]


def trial(cells: list[str], namespace: dict, answer: dict, found: list, report: Path, only: str | None = None) -> None:
    """In the trial process: the cells from the answer's on, with a probe in the answer's place (or,
    with ``only``, that candidate from the start). Never returns: the trial and each of its children
    end here or in the probe."""
    try:
        trials = [(SOLUTION, solution_object(answer, namespace)), (STUB, raise_not_implemented)]
        trials += [(label, obj) for label, obj, signature in found if accepts(signature, answer["positional"])]
        probe = Probe(trials, report)
        if only is not None:
            probe.target = dict(trials)[only]
        setattr(builtins, SLOT, probe)
        rest = [replaced(cells[answer["cell"]], answer)] + cells[answer["cell"] + 1 :]
        done, error = run_cells_until(rest, namespace)
    except BaseException as broke:
        report.write_text(json.dumps({"why": f"{BROKE}: {type(broke).__name__}: {broke}"}))
        os._exit(0)
    # Here in a child: how many cells it ran. Here in the trial: the probe was never called.
    if getattr(builtins, SLOT).target is None:
        why = NOT_CALLED
        if error is not None and any(re.search(rf"\b{answer['name']}\b", cell) for cell in rest[done:]):
            # A cell that names the answer raised before calling it: nothing was tried, which is not
            # "no leak".
            why = f"{BROKE}: {type(error).__name__} {done} cell(s) after the answer's, before any call: {error}"
        elif error is not None:
            # A check that reads the answer's text (lab 04's script) fails with the probe in its place.
            why = f"{NOT_CALLED}; a cell that does not name it raised: {type(error).__name__}: {error}"
        report.write_text(json.dumps({"why": why}))
        os._exit(0)
    os._exit(min(done, 250))


def judge(result: dict, n_cells: int) -> dict:
    """From the children's exit codes (cells they ran): checked or why not, and what passed."""
    if "verdicts" not in result:
        return {"checked": False, "candidates": 0, "passed": [], "why": result["why"]}
    verdicts = result["verdicts"]
    reached, _ = verdicts.pop(SOLUTION)
    stub, _ = verdicts.pop(STUB)
    entry = {"checked": False, "candidates": len(verdicts), "passed": [], "cells": f"{reached} of {n_cells}"}
    # The cells the solution runs (all, or up to one that reads what a launch wrote) are the checks;
    # a candidate passes them when it runs as many.
    if not reached:
        entry["why"] = "the solution fails in its own cell"
    elif stub == reached:
        entry["why"] = UNUSED
    else:
        entry["checked"] = True
        entry["passed"] = [label for label, (done, _) in verdicts.items() if done == reached]
        entry["timed_out"] = [label for label, (done, _) in verdicts.items() if done is None]
    entry["slowest"] = sorted(((s, label) for label, (_, s) in verdicts.items()), reverse=True)[:3]
    return entry


def lab_process(cells: list[str], found: list, reports: Path) -> None:
    """In the lab process: the solution's cells from the top, a trial forked before each answer's cell;
    ends when the cells end or one fails (the answers after it are not reached)."""
    namespace = {"__name__": "__lab__"}
    done = 0
    for index, answer in enumerate(answers(cells)):
        if run_cells(cells[done : answer["cell"]], namespace) != answer["cell"] - done:
            os._exit(0)
        done = answer["cell"]
        report = reports / f"{index}.json"
        pid = fork_child()
        if pid == 0:
            trial(cells, namespace, answer, found, report)
        wait_child(pid, 600)
        result = json.loads(report.read_text()) if report.exists() else {"why": "the trial ran out of time"}
        for label in result.pop("rerun", []):
            began = time.perf_counter()
            pid = fork_child()
            if pid == 0:
                trial(cells, namespace, answer, found, report, only=label)
            result["verdicts"][label] = (wait_child(pid, 120), round(time.perf_counter() - began, 3))
        report.write_text(json.dumps(result))
        report.with_suffix(".cells").write_text(str(len(cells) - answer["cell"]))
    os._exit(0)


def search(solution: Path, found: list[tuple[str, object, inspect.Signature]]) -> dict:
    """Per answer of ``solution``: checked in-kernel or not, candidates tried, those that passed."""
    began = time.perf_counter()
    cells = [c for c in code_cells(solution) if not LAUNCHES.search(c)]
    with tempfile.TemporaryDirectory() as folder:
        reports = Path(folder)
        pid = fork_child()
        if pid == 0:
            lab_process(cells, found, reports)
        wait_child(pid, 900)
        report = {}
        for index, answer in enumerate(answers(cells)):
            path = reports / f"{index}.json"
            if not path.exists():
                report[answer["name"]] = {"checked": False, "candidates": 0, "passed": [], "why": "not reached"}
                continue
            n_cells = int(path.with_suffix(".cells").read_text())
            report[answer["name"]] = judge(json.loads(path.read_text()), n_cells)
    report["(seconds)"] = round(time.perf_counter() - began, 2)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("solutions", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, required=True, help="working directory of the cells")
    parser.add_argument("--plant", type=Path, action="append", default=[], help="a module to search too")
    args = parser.parse_args()
    solutions = [s.resolve() for s in args.solutions]
    planted = [p.resolve() for p in args.plant]
    # Files the cells rewrite are read again by the same name: never from a stale bytecode cache.
    sys.dont_write_bytecode = True
    # One compute thread, as the labs use: a process forked after a multi-threaded OpenMP region
    # can hang in its next one.
    os.environ["OMP_NUM_THREADS"] = "1"
    # MKL's own allocator keeps per-thread books under a lock: a process forked after the labs' threads
    # ran a matrix product can spin on that lock forever. The system allocator has no such books.
    os.environ["MKL_DISABLE_FAST_MM"] = "1"
    # Candidates leave odd objects behind (figures whose font files are closed): their complaints
    # when collected are not the search's.
    sys.unraisablehook = lambda unraisable: None
    os.chdir(args.work)
    began = time.perf_counter()
    modules, refused = importable_modules(planted)
    found = candidates(modules)
    imported = time.perf_counter() - began
    labs = {s.name: search(s, found) for s in solutions}
    result = {
        "modules": len(modules),
        "not_imported": refused,
        "import_seconds": round(imported, 2),
        "lab_seconds": {name: lab.pop("(seconds)") for name, lab in labs.items()},
        "labs": labs,
        "seconds": round(time.perf_counter() - began, 2),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
