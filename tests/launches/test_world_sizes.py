"""Every script a user runs with `torchrun --nproc_per_node=<GPUs>` works at 1 to 8 processes, or
refuses the count in one line before it starts anything.

Nothing here lists scripts or counts; both are read from the files:
- the scripts: every script of scripts/ that joins a process group, with the arguments of the first
  command line its docstring gives (script_usage.py), each run as rank 0 of a world of N (the
  environment torchrun would give it), N = 1 to 8, until it joins a group or refuses;
- train_gpt.py: every layout of its table (parallel_course.training.layouts) at every N, refused
  in its row's own words wherever the row does not list N, and elsewhere joining, or refusing in
  one line for the model's sake (whole heads per tensor-parallel rank, the batch over the
  data-parallel ranks).
A CPU machine cannot launch 8 processes of every script within the suite's time, so the counts
where a script's own arithmetic changes are launched for real: one process (as plain `python`: a
pipeline of one stage, tensor parallelism on one rank) and three (8 layers over 3 stages).
The notebooks launch the same scripts at 2 and 4, and `make test-gpu` at every GPU (tests/gpu/test_gpu.py).
"""

from pathlib import Path

import pytest

from helpers import job_command, launch, run_until_joined
from parallel_course.training.layouts import LAYOUTS
from script_usage import course_scripts, first_torchrun, joins_a_group

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
COUNTS = range(1, 9)


def rank0_of(n: int) -> dict:
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29400",
    }


def layout_arguments(name: str) -> tuple[str, ...]:
    """train_gpt.py in one layout: the experts it spreads, where it spreads experts."""
    return ("--parallel", name, *(("--moe-experts", "8") if LAYOUTS[name].experts else ()), "--out", "o")


def cases() -> list[tuple[str, int, tuple[str, ...]]]:
    """(script, world size, arguments): every joining script at every count, train_gpt.py in every layout."""
    found = []
    for name, path in course_scripts().items():
        text = path.read_text()
        if joins_a_group(text):
            found += [(name, n, first_torchrun(name, text)) for n in COUNTS]
    found += [("train_gpt.py", n, layout_arguments(layout)) for layout in LAYOUTS for n in COUNTS]
    return found


@pytest.fixture(scope="module")
def stops(tmp_path_factory):
    """How each case stopped, run as rank 0 of its world (all in one subprocess)."""
    found = cases()
    runs = [{"argv": [str(SCRIPTS / script), *args], "environment": rank0_of(n)} for script, n, args in found]
    return dict(zip(found, run_until_joined(runs, tmp_path_factory.mktemp("rank0"))))


def refused_in_one_line(stop: dict, script: str) -> bool:
    return stop["stopped"].startswith("exit") and len(stop["errors"]) == 1 and stop["errors"][0].startswith(script)


def test_every_script_runs_at_every_count_or_refuses_it_in_one_line_before_it_starts(stops):
    wrong = [
        f"{script} at {n} processes {list(args)}: {stop}"
        for (script, n, args), stop in stops.items()
        if stop["stopped"] != "joined a group" and not refused_in_one_line(stop, script)
    ]
    assert not wrong, "\n".join(wrong)
    # The rule covers the course's scripts, not a handful, and not only refusals.
    assert len({script for script, _, _ in stops}) >= 30
    assert sum(stop["stopped"] == "joined a group" for stop in stops.values()) >= len(stops) // 2


def test_train_gpt_runs_each_layout_on_the_counts_its_row_of_the_table_lists(stops):
    wrong = []
    for layout in LAYOUTS.values():
        for n in COUNTS:
            stop = stops[("train_gpt.py", n, layout_arguments(layout.name))]
            if not layout.processes.allows(n):
                if not (refused_in_one_line(stop, "train_gpt.py") and stop["errors"][0].endswith(layout.refusal(n))):
                    wrong.append(f"{layout.name} at {n}: expected the table's refusal, got {stop}")
            elif stop["stopped"] != "joined a group" and str(layout.processes) in " ".join(stop["errors"]):
                wrong.append(f"{layout.name} at {n}: the table lists {n}, but {stop['errors']}")
    assert not wrong, "\n".join(wrong)
    # What the model adds to the table: whole heads (4) per tensor-parallel rank, so tp on 3 is refused.
    assert "4 attention heads over 3 ranks" in stops[("train_gpt.py", 3, layout_arguments("tp"))]["errors"][0]
    assert stops[("train_gpt.py", 4, layout_arguments("tp"))]["stopped"] == "joined a group"


def launch_ok(tmp_path, nproc, script, *args):
    # One process as a user runs it: plain python.
    cmd = job_command(SCRIPTS / script, None if nproc == 1 else nproc, *args)
    result = launch(cmd, tmp_path, timeout=120)
    assert result.returncode == 0, f"{script} on {nproc}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.parametrize("nproc", [1, 3])
def test_pipelining_with_one_stage_and_with_uneven_stages_equals_the_unsplit_model(tmp_path, nproc):
    stdout = launch_ok(tmp_path, nproc, "c07_torch_pipelining.py")
    # GPipe and 1F1B; interleaved 1F1B too where 2 chunks per rank fit and m is a multiple of the ranks.
    assert stdout.count("equal the unsplit model's: True") == (3 if nproc == 1 else 2), stdout
    assert f"{nproc} stage(s) of {'8' if nproc == 1 else '2 or 3'} layers" in stdout, stdout


def test_tensor_parallel_layers_on_one_rank_send_nothing_and_still_agree(tmp_path):
    stdout = launch_ok(tmp_path, 1, "c07_tensor_parallel.py")
    assert "FAIL" not in stdout and "PASS the MLP communicates once each way (on 2+ ranks)" in stdout, stdout
