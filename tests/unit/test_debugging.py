"""parallel_course.debugging (14b): flight records, stack dumps and stragglers, on hand-made inputs;
c14b_debugging.py's join (its timeout apart from the collectives')."""

import argparse
import importlib.util
import os
import pickle
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from parallel_course import debugging as dbg

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def entry(seq, op, sizes, out_sizes=None, group=("0", "default_pg")):
    """One flight-record entry with the fields torch 2.13's gloo recorder writes."""
    return {
        "frames": [],
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": list(group),
        "thread_name": "python",
        "thread_id": "1",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"gloo:{op}",
        "time_created_ns": 1000 * seq,
        "input_sizes": [list(sizes)],
        "input_dtypes": ["Float"],
        "output_sizes": [list(out_sizes or sizes)],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "time_discovered_started_ns": 0,
        "time_discovered_completed_ns": 0,
        "retired": True,
        "timeout_ms": 3000,
        "is_p2p": False,
    }


def record(*entries, world_size=2):
    """A record as gloo writes it in torch 2.13: pg_config under an empty name."""
    return {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": str(list(range(world_size)))}},
        "comm_lib_version": "",
        "pg_status": {},
        "entries": list(entries),
    }


STEPS = [entry(s, "all_reduce", [64, 64]) for s in (1, 2, 3)]
# Rank 1 stuck before step 4's all-reduce.
STUCK = {0: record(*STEPS, entry(4, "all_reduce", [64, 64])), 1: record(*STEPS)}
# Rank 0 alone gathers; rank 1 goes on to the next all-reduce.
MISMATCH = {
    0: record(*STEPS, entry(4, "all_gather", [64], [2, 64])),
    1: record(*STEPS, entry(4, "all_reduce", [64, 64])),
}


def write(records, folder):
    folder.mkdir(parents=True, exist_ok=True)
    for rank, r in records.items():
        (folder / f"rank_{rank}").write_bytes(pickle.dumps(r))
    return folder


def test_records_are_read_by_rank_and_only_plain_data_is_unpickled(tmp_path):
    folder = write(STUCK, tmp_path / "fr")
    (folder / "notes.txt").write_text("not a record")
    assert list(dbg.read_flight_records(folder)) == [0, 1]
    assert dbg.read_flight_records(folder)[0] == STUCK[0]
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "rank_0").write_bytes(pickle.dumps({"entries": [os.getcwd], "x": print}))
    with pytest.raises(pickle.UnpicklingError, match="plain data"):
        dbg.read_flight_records(tmp_path / "evil")
    with pytest.raises(FileNotFoundError):
        dbg.read_flight_records(tmp_path / "evil", prefix="trace_")


def test_collectives_in_order_without_point_to_point_and_other_groups():
    p2p = {**entry(9, "send", [4]), "is_p2p": True}
    other = entry(1, "all_gather", [8], group=("1", "tp"))
    found = dbg.collectives(record(STEPS[1], p2p, STEPS[0], other))
    assert [(c.seq, c.op, c.input_sizes) for c in found] == [
        (1, "all_reduce", ((64, 64),)),
        (2, "all_reduce", ((64, 64),)),
    ]
    assert [c.op for c in dbg.collectives(record(STEPS[0], other), group="1")] == ["all_gather"]
    assert str(found[0]) == "#1 all_reduce(64x64)"
    assert dbg.collectives(record()) == []


def test_the_rank_that_entered_fewer_collectives_is_behind():
    assert dbg.behind(STUCK) == [1]
    assert dbg.behind(MISMATCH) == []
    assert dbg.behind({0: record(*STEPS), 1: record(*STEPS), 2: record(STEPS[0]), 3: record()}) == [2, 3]
    assert dbg.last_entered({0: record()}) == {0: None}


def test_the_first_collective_the_ranks_called_differently():
    seq, here = dbg.first_mismatch(MISMATCH)
    assert seq == 4 and (here[0].op, here[1].op) == ("all_gather", "all_reduce")
    assert dbg.first_mismatch(STUCK) is None
    # The same operation with other sizes is a mismatch too; ranks missing a number are not compared.
    sizes = {0: record(entry(1, "all_reduce", [4])), 1: record(entry(1, "all_reduce", [5])), 2: record()}
    assert dbg.first_mismatch(sizes)[0] == 1 and set(dbg.first_mismatch(sizes)[1]) == {0, 1}


def test_diagnose_says_each_ranks_last_collective_and_the_verdict():
    assert dbg.diagnose(STUCK) == [
        "rank 0: last collective entered #4 all_reduce(64x64)",
        "rank 1: last collective entered #3 all_reduce(64x64)",
        "behind: rank(s) [1] never entered collective #4",
    ]
    assert dbg.diagnose(MISMATCH)[-1] == "mismatch at collective #4: rank 0 all_gather(64), rank 1 all_reduce(64x64)"
    assert dbg.diagnose({0: record(*STEPS), 1: record(*STEPS)})[-1] == "every rank entered the same collectives"


def test_torchs_analyzer_reads_the_copies_made_for_it_and_not_gloos_records(tmp_path):
    raw = write(MISMATCH, tmp_path / "fr")
    assert "KeyError" in dbg.run_analyzer(raw)
    fixed = dbg.for_analyzer(raw, tmp_path / "fixed")
    assert dbg.load_flight_record(fixed / "rank_0")["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}
    }
    report = dbg.run_analyzer(fixed)
    assert "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH" in report
    assert "missing ranks: {1}" in dbg.run_analyzer(dbg.for_analyzer(write(STUCK, tmp_path / "s"), tmp_path / "s2"))


PY_SPY = """Process 3561: /venv/bin/python -u c14b_debugging.py stuck --out o
Python v3.11.7 (/usr/bin/python3.11)

Thread 3561 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
    train (c14b_debugging.py:153)
    main (c14b_debugging.py:202)
    <module> (c14b_debugging.py:206)
Thread 3605 (idle): "Thread-1 (_wait_for_request)"
    Condition.wait (threading.py:331)
    FlightRecord._wait_for_request (c14b_debugging.py:98)
"""

FAULTHANDLER = """Thread 0x00007f00aaaa0640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/work/c14b_debugging.py", line 98 in _wait_for_request

Current thread 0x00007f00bbbb1740 (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/c14b_debugging.py", line 153 in train
  File "/work/c14b_debugging.py", line 202 in main
  File "/work/c14b_debugging.py", line 206 in <module>
"""


def test_py_spy_and_faulthandler_dumps_give_the_same_frames():
    spy, fh = dbg.parse_py_spy(PY_SPY), dbg.parse_faulthandler(FAULTHANDLER)
    assert [f.function for f in spy] == ["all_reduce", "wrapper", "train", "main", "<module>"]
    assert [(f.function, f.line) for f in spy] == [(f.function, f.line) for f in fh]
    assert dbg.innermost(spy) == dbg.Frame("all_reduce", "torch/distributed/distributed_c10d.py", 3252)
    for frames in (spy, fh):
        assert (
            dbg.innermost(frames, "c14b_debugging.py").function,
            dbg.innermost(frames, "c14b_debugging.py").line,
        ) == ("train", 153)
    assert dbg.innermost(spy, "other.py") is None
    assert str(dbg.innermost(fh, "c14b_debugging.py")) == "train (c14b_debugging.py, line 153)"
    # One thread, dumped with all_threads=False; and another thread asked for by name.
    single = "Stack (most recent call first):\n" + FAULTHANDLER.split("call first):\n")[-1]
    assert dbg.parse_faulthandler(single) == fh
    assert [f.function for f in dbg.parse_py_spy(PY_SPY, thread="Thread-1 (_wait_for_request)")] == [
        "wait",
        "_wait_for_request",
    ]
    assert dbg.parse_py_spy("") == [] and dbg.parse_faulthandler("") == []
    # In colour (FORCE_COLOR), and a main thread without a name (no threading module imported).
    coloured = (
        "Thread \x1b[33m\x1b[1m9272\x1b[0m (idle)\n"
        "    \x1b[32m<module>\x1b[0m (\x1b[36m<string>\x1b[0m:\x1b[2m1\x1b[0m)\n"
    )
    assert dbg.parse_py_spy(coloured) == [dbg.Frame("<module>", "<string>", 1)]


def test_a_comparison_of_stacks_needs_two_tools():
    fh = dbg.parse_faulthandler(FAULTHANDLER)
    spy = dbg.parse_py_spy(PY_SPY)
    both = {0: {"faulthandler": fh, "py-spy": spy}, 1: {"faulthandler": fh[1:], "py-spy": spy[1:]}}
    assert dbg.tools_used(both) == ["faulthandler", "py-spy"]
    assert dbg.disagreeing_ranks(both) == []
    # Negative control: another rank's frames in place of rank 0's py-spy dump.
    assert dbg.disagreeing_ranks({**both, 0: {"faulthandler": fh, "py-spy": spy[1:]}}) == [0]
    # py-spy refused on rank 1: nothing to compare there, and no "they agree".
    one_tool = {**both, 1: {"faulthandler": fh}}
    assert dbg.tools_used(one_tool) == ["faulthandler"]
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\]: one tool"):
        dbg.disagreeing_ranks(one_tool)


def test_c14b_joins_with_setups_timeout_then_shortens_its_collectives(monkeypatch):
    # On nccl the join waits for rank 0's unique id in the store, bounded by the group's timeout:
    # 4 s would fail ranks whose CUDA start-up is slower. The join keeps setup()'s own timeout.
    monkeypatch.syspath_prepend(str(SCRIPTS))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = importlib.util.spec_from_file_location("c14b_debugging", SCRIPTS / "c14b_debugging.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    joins = []
    real_init = dist.init_process_group
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: joins.append(k["timeout"]) or real_init(*a, **k))
    script.join(argparse.Namespace(timeout=4.0))
    try:
        gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert joins == [timedelta(seconds=30)]
        assert gloo.options._timeout == timedelta(seconds=4)
    finally:
        dist.destroy_process_group()


def test_py_spy_gives_nothing_where_it_is_missing_or_may_not_attach(monkeypatch):
    # No such process: py-spy (where installed) fails, as where ptrace is refused.
    assert dbg.py_spy_dump(2**22 + 12345) is None
    monkeypatch.setattr(dbg.shutil, "which", lambda *args, **kwargs: None)
    assert dbg.py_spy_dump(os.getpid()) is None


def test_the_straggler_is_the_rank_slow_outside_the_collectives():
    # Rank 2 spends 0.2 s more per step outside; the others wait for it inside the all-reduce.
    outside = [[0.01, 0.01, 0.5, 0.01], [0.012, 0.011, 0.01, 0.01], [0.21, 0.2, 0.22, 0.21]]
    inside = [[0.2, 0.19, 0.0, 0.2], [0.2, 0.2, 0.2, 0.2], [0.001, 0.002, 0.001, 0.001]]
    slow, medians = dbg.stragglers(outside, inside)
    assert slow == [2]
    # Step times are alike on every rank: they cannot name the straggler.
    steps = [m["step"] for m in medians]
    assert max(steps) - min(steps) < 0.02
    assert medians[0]["outside"] == pytest.approx(0.01)
    # No straggler when the ranks are alike, or differ by less than the gap.
    assert dbg.stragglers([[0.01] * 3, [0.011] * 3], [[0.0] * 3] * 2)[0] == []
    assert dbg.stragglers([[0.001] * 3, [0.005] * 3], [[0.0] * 3] * 2)[0] == []
    with pytest.raises(ValueError):
        dbg.stragglers([[0.1]], [])
