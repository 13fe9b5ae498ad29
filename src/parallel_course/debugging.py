"""Debugging a job at scale (chapter 14b): read what each rank left behind and name the culprit.

- **Flight records.** torch keeps, per rank, the last N collectives it entered: sequence number,
  operation, sizes, dtypes, state, the calling stack. In torch 2.13 it is on by default, N = 2000
  (``TORCH_FR_BUFFER_SIZE``, older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``; 0 turns it off:
  ``FlightRecorder.hpp``), on gloo as on nccl. ``torch._C._distributed_c10d._dump_fr_trace()``
  returns them as a pickle, the format of torch's analyzer
  (``python -m torch.distributed.flight_recorder.fr_trace DIR``).
  ``read_flight_records`` loads one folder of them (nothing but plain data is unpickled),
  ``behind`` names the ranks that entered fewer collectives than the others, ``first_mismatch`` the
  first collective the ranks called differently.
- **Stack dumps.** ``py-spy dump --pid PID`` (from outside, needs ptrace rights) and
  ``faulthandler`` (from inside, on a signal the script registered) both give each thread's
  Python stack; ``parse_py_spy`` and ``parse_faulthandler`` read them into the same frames, so that
  ``innermost`` gives the same answer from either, and ``disagreeing_ranks`` compares them (only
  where both tools ran: ``tools_used`` says which did).
- **Stragglers.** Every rank's step takes as long as the slowest rank's: step times alone cannot
  name it. Time outside the collectives can: ``stragglers`` compares each rank's median.

Sources: PyTorch's flight recorder tutorial (https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html)
and torch 2.13's ``torch/distributed/flight_recorder`` (the dump's fields, the analyzer); py-spy's
README (https://github.com/benfred/py-spy) for its ``dump`` output; CPython's ``faulthandler``
documentation for its format.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# Flight records


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, strings and numbers only: unpickling anything else runs code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a flight record holds plain data, not {module}.{name}")


def load_flight_record(path: str | Path) -> dict:
    """One rank's flight record, as ``_dump_fr_trace()`` wrote it."""
    with open(path, "rb") as f:
        return _PlainData(f).load()


def read_flight_records(folder: str | Path, prefix: str = "rank_") -> dict[int, dict]:
    """Every rank's record in ``folder`` (files ``<prefix><rank>``), by rank."""
    found = {}
    for path in Path(folder).iterdir():
        if path.name.startswith(prefix) and path.name[len(prefix) :].isdigit():
            found[int(path.name[len(prefix) :])] = load_flight_record(path)
    if not found:
        raise FileNotFoundError(f"no flight record named {prefix}<rank> in {folder}")
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Collective:
    """One entry of a flight record: what a rank entered, in the order it entered it."""

    seq: int
    op: str
    input_sizes: tuple
    output_sizes: tuple
    state: str

    @property
    def call(self) -> str:
        """The operation and its input sizes: ``all_reduce(64x64)``."""
        sizes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.input_sizes)
        return f"{self.op}({sizes})"

    def __str__(self):
        return f"#{self.seq} {self.call}"


def _sizes(sizes) -> tuple:
    return tuple(tuple(s) for s in sizes)


def collectives(record: dict, group: str | None = None) -> list[Collective]:
    """The collectives of one rank's record (point-to-point operations left out), in sequence order.

    ``group``: the process group's name (``entry["process_group"][0]``); None takes the group of
    the record's first collective, the default group when the script made no other.
    """
    entries = [e for e in record["entries"] if not e.get("is_p2p", False)]
    if group is None and entries:
        group = entries[0]["process_group"][0]
    found = [
        Collective(
            seq=int(e["collective_seq_id"]),
            # "gloo:all_reduce" or "nccl:all_reduce": the operation, without the backend.
            op=e["profiling_name"].split(":", 1)[-1],
            input_sizes=_sizes(e["input_sizes"]),
            output_sizes=_sizes(e["output_sizes"]),
            state=e["state"],
        )
        for e in entries
        if e["process_group"][0] == group
    ]
    return sorted(found, key=lambda c: c.seq)


def last_entered(records: dict[int, dict]) -> dict[int, Collective | None]:
    """Each rank's last collective (None for a rank that entered none)."""
    return {rank: (collectives(r) or [None])[-1] for rank, r in records.items()}


def behind(records: dict[int, dict]) -> list[int]:
    """The ranks that entered fewer collectives than the furthest rank: where a hang starts.
    Empty when every rank entered the same number."""
    last = {rank: c.seq if c else 0 for rank, c in last_entered(records).items()}
    furthest = max(last.values())
    return [rank for rank, seq in last.items() if seq < furthest]


def first_mismatch(records: dict[int, dict]) -> tuple[int, dict[int, Collective]] | None:
    """The first sequence number that two ranks entered with different operations or sizes, and
    what each rank entered there; None when the ranks agree wherever both entered."""
    by_rank = {rank: {c.seq: c for c in collectives(r)} for rank, r in records.items()}
    for seq in sorted(set().union(*by_rank.values())):
        here = {rank: calls[seq] for rank, calls in by_rank.items() if seq in calls}
        if len({(c.op, c.input_sizes) for c in here.values()}) > 1:
            return seq, here
    return None


def diagnose(records: dict[int, dict]) -> list[str]:
    """What the records say, in a few lines: each rank's last collective, then the verdict."""
    last = last_entered(records)
    lines = [f"rank {rank}: last collective entered {c if c else '(none)'}" for rank, c in last.items()]
    mismatch = first_mismatch(records)
    if mismatch:
        seq, here = mismatch
        calls = ", ".join(f"rank {rank} {c.call}" for rank, c in here.items())
        lines.append(f"mismatch at collective #{seq}: {calls}")
    late = behind(records)
    if late:
        furthest = max(c.seq for c in last.values() if c)
        lines.append(f"behind: rank(s) {late} never entered collective #{furthest}")
    if not mismatch and not late:
        lines.append("every rank entered the same collectives")
    return lines


def for_analyzer(src: str | Path, dst: str | Path, prefix: str = "rank_") -> Path:
    """Copies of the records in ``src`` that torch 2.13's analyzer (``fr_trace``) can read.

    The analyzer finds each entry's group in ``pg_config`` under the group's name. On gloo,
    torch 2.13 records ``pg_config`` under an empty name (``""``, description ``""``), while the
    entries name the group (``"0"``, ``"default_pg"``): the analyzer stops with a ``KeyError``.
    The copies file each group's configuration under the name and description its entries use.
    """
    dst = Path(dst)
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for rank, record in read_flight_records(src, prefix).items():
        names = {tuple(e["process_group"]) for e in record["entries"]}
        config = dict(record["pg_config"])
        if "" in config and len(names) == 1:
            name, desc = names.pop()
            config[name] = {**config.pop(""), "name": name, "desc": desc}
        with open(dst / f"{prefix}{rank}", "wb") as f:
            pickle.dump({**record, "pg_config": config}, f)
    return dst


def run_analyzer(folder: str | Path, *options: str) -> str:
    """torch's flight-recorder analyzer on ``folder``, in this process; what it reports, as text
    (it logs to a handler of its own: captured here), or its error's last line."""
    from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger

    handlers = FlightRecorderLogger().logger.handlers
    buffer = io.StringIO()
    capture = logging.StreamHandler(buffer)
    saved = [(h, h.setStream(buffer)) for h in handlers if isinstance(h, logging.StreamHandler)]
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            from torch.distributed.flight_recorder import fr_trace

            fr_trace.main([str(folder), *options])
        except Exception as e:
            buffer.write(f"the analyzer stopped: {type(e).__name__}: {e}\n")
        finally:
            for handler, stream in saved:
                handler.setStream(stream)
            capture.close()
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# Stack dumps


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def __str__(self):
        return f"{self.function} ({Path(self.file).name}, line {self.line})"


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_py_spy(text: str, thread: str = "MainThread") -> list[Frame]:
    """The frames of one thread in ``py-spy dump`` output, innermost first.

    py-spy prints ``Thread 123 (idle): "MainThread"``, then one line per frame,
    ``    function (file:line)``, innermost first; colours where the environment asks for them
    (removed here). A thread without a name (a process that never imported ``threading``) is taken
    for the main thread when it holds the ``<module>`` frame.
    """
    threads, frames = [], None
    for line in ANSI.sub("", text).splitlines():
        if line.startswith("Thread "):
            frames = []
            threads.append((line, frames))
        elif frames is not None and (m := re.match(r"\s+(.+?) \((.+):(\d+)\)\s*$", line)):
            # py-spy names a method Class.method and a closure f.<locals>.g: keep the last name.
            frames.append(Frame(m.group(1).split(".")[-1], m.group(2), int(m.group(3))))
        elif line.strip() and not line.startswith(" "):
            frames = None
    named = [frames for header, frames in threads if f'"{thread}"' in header]
    if named or thread != "MainThread":
        return named[0] if named else []
    main = [frames for header, frames in threads if '"' not in header and any(f.function == "<module>" for f in frames)]
    return main[0] if main else []


def parse_faulthandler(text: str) -> list[Frame]:
    """The frames of the main thread in a ``faulthandler`` dump, innermost first.

    faulthandler prints ``Stack (most recent call first):`` for one thread, or one block per
    thread (``Thread 0x... (most recent call first):``, the signalled one ``Current thread``); the
    main thread is the block that holds the ``<module>`` frame.
    """
    blocks = re.split(r"(?m)^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$|^Stack \(most", text)
    parsed = [
        [Frame(f, file, int(line)) for file, line, f in re.findall(r'File "(.+)", line (\d+) in (\S+)', block)]
        for block in blocks
    ]
    main = [frames for frames in parsed if any(fr.function == "<module>" for fr in frames)]
    return main[0] if main else []


def innermost(frames: list[Frame], script: str | None = None) -> Frame | None:
    """The innermost frame, or with ``script`` (a file name) the innermost frame in that file."""
    for frame in frames:
        if script is None or Path(frame.file).name == script:
            return frame
    return None


def py_spy_dump(pid: int, timeout: float = 20) -> str | None:
    """``py-spy dump --pid PID``'s output; None when py-spy is missing or may not attach (ptrace).

    py-spy pauses the process while it reads the stack (a consistent one); ``--nonblocking`` would
    read without pausing, at the risk of a stack torn by the running process (``py-spy dump --help``).
    """
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        return None
    # Plain text, whatever the environment asks (Jupyter's kernel sets FORCE_COLOR).
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env["NO_COLOR"] = "1"
    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout if done.returncode == 0 and "Thread " in done.stdout else None


def stacks_of_hung_job(
    cmd: list[str], out: str | Path, world_size: int, timeout: float = 60, env: dict | None = None
) -> tuple[dict[int, dict[str, list[Frame]]], subprocess.CompletedProcess]:
    """Start a job in the background, wait until every rank has written ``out/ready_rank_R`` (its
    pid, at the bug), then take each rank's stack: with ``py-spy dump`` where it may attach, and
    with the script's ``faulthandler`` (SIGUSR1 to ``out/stack_rank_R.txt``) always. Then let the
    job end, within ``timeout`` s in all; its whole process group is killed after, whatever happens.

    Returns, per rank, the main thread's frames from each tool that gave them ("py-spy",
    "faulthandler"), and the job's exit code and output.
    """
    from parallel_course.launch import _kill_group

    out = Path(out)
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        ready = [out / f"ready_rank_{r}" for r in range(world_size)]
        while not all(p.exists() for p in ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the job ended or timed out before every rank was ready:\n{proc.stderr.read()}")
            time.sleep(0.05)
        # A rank writes its pid just before the call that hangs: give it the moment to get there.
        time.sleep(0.5)
        pids = {r: int(p.read_text()) for r, p in enumerate(ready)}
        spy = {r: py_spy_dump(pid) for r, pid in pids.items()}
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR1)
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        _kill_group(proc.pid)
    stacks = {}
    for r in range(world_size):
        stacks[r] = {"faulthandler": parse_faulthandler((out / f"stack_rank_{r}.txt").read_text())}
        if spy[r] is not None:
            stacks[r]["py-spy"] = parse_py_spy(spy[r])
    return stacks, subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def tools_used(stacks: dict[int, dict[str, list[Frame]]]) -> list[str]:
    """The tools that took the stack of every rank in ``stacks_of_hung_job``'s answer."""
    return sorted(set.intersection(*(set(taken) for taken in stacks.values())))


def disagreeing_ranks(stacks: dict[int, dict[str, list[Frame]]]) -> list[int]:
    """The ranks whose main-thread frames (function and line) differ from one tool to the other.

    Raises ValueError when a rank's stack came from fewer than two tools: with nothing to compare,
    an empty list would say "they agree" about a comparison that was never made.
    """
    alone = [rank for rank, taken in stacks.items() if len(taken) < 2]
    if alone:
        raise ValueError(f"rank(s) {alone}: one tool took the stack, there is nothing to compare it with")
    return [
        rank
        for rank, taken in stacks.items()
        if len({tuple((f.function, f.line) for f in frames) for frames in taken.values()}) > 1
    ]


# ---------------------------------------------------------------------------------------------
# Stragglers


def stragglers(outside_s: list[list[float]], inside_s: list[list[float]], factor: float = 2.0, min_gap_s: float = 0.02):
    """Ranks that spend much longer outside the collectives than the fastest rank.

    ``outside_s[r][step]``: rank r's seconds outside the collectives in each step (compute, input);
    ``inside_s[r][step]``: its seconds inside them, waiting for the others included. A rank is a
    straggler when its median outside time exceeds ``factor`` times the fastest rank's median and
    the fastest by ``min_gap_s`` seconds (medians: one slow step, a busy machine's hiccup, does not
    count). Returns (stragglers, per-rank medians {"outside", "inside", "step"}).
    """
    if len(outside_s) != len(inside_s) or not outside_s:
        raise ValueError("outside_s and inside_s need one list of steps per rank, the same ranks")
    medians = [
        {
            "outside": statistics.median(o),
            "inside": statistics.median(i),
            "step": statistics.median(a + b for a, b in zip(o, i)),
        }
        for o, i in zip(outside_s, inside_s)
    ]
    fastest = min(m["outside"] for m in medians)
    slow = [r for r, m in enumerate(medians) if m["outside"] > factor * fastest and m["outside"] - fastest > min_gap_s]
    return slow, medians
