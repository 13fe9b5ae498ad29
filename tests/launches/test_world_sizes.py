"""Every script the README sends to `torchrun --nproc_per_node=<GPUs>` works at 1 to 8 processes, or
refuses the count in one line before it starts anything.

A CPU machine cannot launch 8 processes of every script within the suite's time, so:
- the refusals are checked without launching: each script runs as rank 0 of a world of N (the
  environment torchrun would give it) and must stop with one line, before it joins a group;
- the counts where a script's own arithmetic changes are launched for real: one process (as
  plain `python`: a pipeline of one stage, tensor parallelism on one rank) and three (8 layers
  over 3 stages).
The notebooks launch the same scripts at 2 and 4, and `make test-gpu` at every GPU (tests/gpu/test_gpu.py).
"""

from pathlib import Path

import pytest

from helpers import job_command, launch, run_until_joined

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

# (script, world size, arguments): counts each script cannot run, and must refuse.
REFUSED = [
    ("c03_send_recv.py", 1, []),  # a send needs a receiver
    ("c07_torch_pipelining.py", 9, []),  # 8 layers, at most 8 stages
    ("c07_torch_pipelining.py", 5, ["--microbatches", "4"]),  # Schedule1F1B: micro-batches >= stages
    ("c07_pipeline_executor.py", 9, []),
    ("c07_tensor_parallel.py", 3, []),  # 16 and 32 features split evenly
    ("train_gpt.py", 3, ["--parallel", "tp", "--out", "o"]),  # 4 heads
    ("train_gpt.py", 8, ["--parallel", "tp", "--out", "o"]),
    ("train_gpt.py", 6, ["--parallel", "2d", "--out", "o"]),  # 64 problems over 3 dp groups
    ("train_gpt.py", 3, ["--parallel", "pp", "--out", "o"]),  # 2 pipeline stages, one per process
    ("train_gpt.py", 6, ["--parallel", "dp_pp", "--out", "o"]),  # 64 problems over 3 dp groups x 4 micro-batches
    ("train_gpt.py", 3, ["--parallel", "cp", "--out", "o"]),  # the sequence over 2 ranks
    ("train_gpt.py", 3, ["--parallel", "ep", "--moe-experts", "4", "--out", "o"]),  # 4 experts over 3 ranks
    ("train_gpt.py", 6, ["--parallel", "dp_ep", "--moe-experts", "4", "--out", "o"]),  # 64 problems over 6 ranks
    ("train_ddp.py", 3, ["--out", "o"]),  # 64 problems over 3 ranks
    ("c11c_accumulation.py", 3, ["--out", "o"]),  # 2d is 2 x 2
    ("c13a_context_parallel.py", 3, ["--out", "o"]),  # its sequence and heads cut for 4
    ("c14b_debugging.py", 1, ["stuck", "--out", "o"]),  # a rank to wait for another
    ("c14b_debugging.py", 1, ["mismatch", "--out", "o"]),
    ("c14c_talking_less.py", 3, ["--mode", "hsdp", "--out", "o"]),  # a 2 x 2 mesh
    ("c17a_float8_fsdp.py", 3, ["--out", "o"]),  # 64 problems over 3 ranks
    ("c17b_compile_sharded.py", 8, ["--part", "layouts", "--out", "o"]),  # tp: 4 heads over 8 ranks
    ("c17b_compile_sharded.py", 6, ["--part", "compiler", "--out", "o"]),  # 64 problems over 6 ranks
]
# ... and counts where the script's own arithmetic changes, which it must accept.
ACCEPTED = [
    ("c07_torch_pipelining.py", 5, []),  # 8 micro-batches by default from 5 stages on
    ("c07_torch_pipelining.py", 8, []),
    ("c07_pipeline_executor.py", 7, []),
    ("c03_ring_allreduce.py", 7, []),  # 2**18 made a multiple of 7
    ("c07_tensor_parallel.py", 8, []),
    ("train_gpt.py", 4, ["--parallel", "tp", "--out", "o"]),
    ("train_gpt.py", 8, ["--parallel", "2d", "--out", "o"]),
    ("train_gpt.py", 8, ["--parallel", "dp_pp", "--out", "o"]),  # 4 dp groups x 4 micro-batches
    ("c17a_float8_fsdp.py", 8, ["--out", "o"]),
    ("c17b_compile_sharded.py", 8, ["--part", "layouts", "--layouts", "fsdp", "--out", "o"]),
]


@pytest.fixture(scope="module")
def stops(tmp_path_factory):
    """How each case of REFUSED and ACCEPTED stopped, run as rank 0 of its world (one subprocess)."""
    cases = REFUSED + ACCEPTED
    runs = [
        {
            "argv": [str(SCRIPTS / script), *args],
            "environment": {
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": str(n),
                "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29400",
            },
        }
        for script, n, args in cases
    ]
    return dict(zip(map(repr, cases), run_until_joined(runs, tmp_path_factory.mktemp("rank0"))))


def test_counts_a_script_cannot_run_are_refused_in_one_line_before_it_starts(stops):
    wrong = []
    for script, n, args in REFUSED:
        found = stops[repr((script, n, args))]
        if (
            found["stopped"] == "joined a group"
            or len(found["errors"]) != 1
            or not found["errors"][0].startswith(script)
        ):
            wrong.append(f"{script} at {n} processes {args}: {found}")
    assert not wrong, "\n".join(wrong)


def test_counts_where_the_arithmetic_changes_are_accepted(stops):
    wrong = [
        f"{script} at {n} processes {args}: {stops[repr((script, n, args))]}"
        for script, n, args in ACCEPTED
        if stops[repr((script, n, args))]["stopped"] != "joined a group"
    ]
    assert not wrong, "\n".join(wrong)


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
