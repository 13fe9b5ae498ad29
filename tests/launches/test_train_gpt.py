"""scripts/train_gpt.py, the capstone's reference script: its arguments.

The layouts themselves (the same losses as one process in ddp, fsdp, tp and 2d with sequence
parallelism, each rank storing its share) are launched and asserted by notebook 11 under strict
nbval; accumulation, the pipeline layouts and checkpoints that change layout by notebook 11c; on
nccl by tests/gpu/test_gpu.py; preemption by tests/launches/test_preemption.py. The process counts
each layout runs on are its row of the table (parallel_course.training.layouts), checked in
tests/unit/test_training.py, and refused before the join, as a process, in test_world_sizes.py.
Here the other argument checks run in this process, and one bad command line as a process: one
error line, exit code 2, nothing written; --help lists the table; one short run with --mfu, for
the throughput figures in metrics.json; and the gradient's scale in every layout of the table, in
three launches (one per process count, train_gpt_runs.py): with clipping firing in every step, on
problems of mixed lengths, some with micro-batches, each layout's gradient norms and losses equal
one process's; a step whose norm is not finite (injected on one rank only) is skipped by every rank;
and the memory of --parallel cp (chapter 16: ring-flash attention keeps each rank's own keys and
values only): at most 0.6 of one process's activation bytes per rank, the losses equal. The same
three launches train the dense layouts with --compile (equal to their eager runs) and --float8 (apart
from float32, within the tolerance chapter 17a derives of bfloat16, and its layouts within twice it
of its one process), and 2d with --dtype bfloat16.
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import job_command, job_environment, launch, load_script
from parallel_course.launch import run_bounded
from parallel_course.training.layouts import LAYOUTS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_gpt.py"
RUNS = ROOT / "scripts" / "train_gpt_runs.py"


@pytest.fixture(scope="module")
def train_gpt():
    return load_script(SCRIPT)


def test_a_bad_command_line_is_one_error_line(tmp_path):
    result = run_bounded([sys.executable, str(SCRIPT), "--steps", "-1", "--out", str(tmp_path / "out")], timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == ["train_gpt.py: error: --steps must be at least 0 and --global-batch-size at least 1"]
    assert result.stderr.splitlines()[-1] == errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, world_size, message",
    [
        (["--steps", "-1"], 1, "--steps must be at least 0"),
        (["--steps", "0"], 1, "--steps 0 trains nothing: add --checkpoint-dir"),
        (["--steps", "0", "--checkpoint-dir", "CKPT"], 1, None),  # a seed checkpoint
        (["--global-batch-size", "-1"], 1, "--global-batch-size at least 1"),
        (["--lr", "nan"], 1, "--lr must be positive"),
        (["--digits", "5"], 1, "--digits must be 1 to 4"),
        (["--parallel", "pipeline"], 1, "invalid choice"),
        (["--parallel", "2d", "--global-batch-size", "12"], 6, None),  # 3 x 2: fine
        (["--parallel", "2d", "--global-batch-size", "8"], 6, "not divisible by the 3 data-parallel ranks"),
        (["--parallel", "ddp", "--global-batch-size", "6"], 4, "not divisible by the 4 data-parallel ranks"),
        (["--parallel", "tp", "--global-batch-size", "7"], 4, None),  # tp: one data-parallel rank
        (["--parallel", "tp"], 3, "splits the 4 attention heads over 3 ranks: use a world size that divides 4"),
        (["--parallel", "tp", "--sequence-parallel"], 2, None),
        (["--parallel", "fsdp", "--sequence-parallel"], 2, "--sequence-parallel needs --parallel tp or 2d, got fsdp"),
        (["--parallel", "pp", "--grad-accum", "1"], 2, "the pipeline's 2 stages need --grad-accum 2 or more"),
        (["--parallel", "pp", "--global-batch-size", "8"], 2, None),  # 4 micro-batches by default
        (["--parallel", "dp_pp", "--global-batch-size", "12"], 4, "not divisible by the 2 data-parallel ranks x 4"),
        (["--parallel", "dp_pp", "--grad-accum", "2", "--global-batch-size", "12"], 4, None),
        (["--grad-accum", "0"], 1, "--grad-accum must be at least 1, got 0"),
        (["--grad-accum", "3"], 1, "--global-batch-size 64 is not divisible by the 1 data-parallel ranks x 3"),
        (["--parallel", "ddp", "--grad-accum", "4", "--global-batch-size", "20"], 2, "x 4 micro-batches"),
        (["--sync-every-micro-batch"], 1, "--sync-every-micro-batch needs --parallel ddp, fsdp or 2d, got single"),
        (["--parallel", "fsdp", "--sync-every-micro-batch", "--grad-accum", "2"], 2, None),
        (["--parallel", "cp", "--digits", "3"], 2, "4 equal zig-zag chunks: --digits 3 gives 11 tokens"),
        (["--parallel", "cp", "--variable-length", "--grad-accum", "2"], 2, None),
        (["--moe-experts", "4", "--capacity-factor", "0.5", "--top-k", "1"], 1, None),
        (["--moe-experts", "-1"], 1, "--moe-experts must be at least 0 (0: the dense MLP), got -1"),
        (["--moe-experts", "4", "--parallel", "ddp"], 2, "runs with --parallel single, ep or dp_ep, got ddp"),
        (["--moe-experts", "2", "--top-k", "3"], 1, "--top-k must be 1 to the 2 experts, got 3"),
        (["--moe-experts", "4", "--capacity-factor", "0"], 1, "--capacity-factor must be above 0"),
        (["--parallel", "ep"], 2, "--parallel ep spreads experts over the ranks: add --moe-experts E"),
        (["--parallel", "ep", "--moe-experts", "6"], 4, "--parallel ep: the 6 experts do not divide over 4 ranks"),
        (["--parallel", "ep", "--moe-experts", "4", "--global-batch-size", "8"], 4, None),
        (["--parallel", "dp_ep", "--moe-experts", "3"], 4, "the 3 experts do not divide over 2 ranks"),
        (["--parallel", "dp_ep", "--moe-experts", "2", "--grad-accum", "2"], 6, "by the 6 data-parallel ranks x 2"),
        (["--parallel", "ep", "--moe-experts", "2", "--checkpoint-dir", "CKPT"], 2, "saves no checkpoints yet"),
        (["--checkpoint-every", "4"], 1, "--checkpoint-every and --async-checkpoint need --checkpoint-dir"),
        (["--checkpoint-dir", "CKPT", "--checkpoint-every", "0"], 1, "--checkpoint-every must be at least 1, got 0"),
        (["--checkpoint-dir", "OUT_IS_A_FILE"], 1, "exists and is not a folder"),
        (["--resume", "CKPT_EMPTY"], 1, "no checkpoint there"),
        (["--resume", "CKPT_STEP_4"], 1, None),
        (["--resume", "CKPT_STEP_4", "--steps", "4"], 1, "is at step 4: nothing left of --steps 4"),
        (["--resume-weights-only"], 1, "--resume-weights-only needs --resume"),
        (["--clip-grad-norm", "0"], 1, "--clip-grad-norm must be positive, got 0.0"),
        (["--clip-grad-norm", "0.5", "--parallel", "2d"], 4, None),
        (["--inject-nonfinite-step", "0"], 1, "--inject-nonfinite-step must be a step from 1 to --steps 200"),
        (["--inject-nonfinite-step", "9", "--steps", "8"], 1, "a step from 1 to --steps 8"),
        (
            ["--slip", "no-dp-factor"],
            1,
            "--slip no-dp-factor changes nothing in --parallel single on 1: no batch ranks",
        ),
        (["--slip", "no-dp-factor", "--parallel", "cp"], 2, None),
        (["--slip", "scale-grads", "--parallel", "ddp"], 2, "no pp ranks"),
        (["--slip", "local-norm", "--parallel", "fsdp"], 2, None),
        (["--slip", "stages-unreduced", "--parallel", "dp_pp"], 4, None),
        (["--slip", "experts-every-rank", "--parallel", "ep", "--moe-experts", "4"], 2, "no expert_dp ranks"),
        (
            ["--slip", "experts-every-rank", "--parallel", "dp_ep", "--moe-experts", "4", "--global-batch-size", "8"],
            4,
            None,
        ),
        (["--slip", "forgot-it"], 2, "invalid choice"),
        (["--float8", "--compile", "--dtype", "bfloat16", "--parallel", "2d"], 4, None),
        (["--compile", "--compile-backend", "inductor", "--parallel", "tp"], 2, None),
        (["--float8", "--parallel", "pp"], 2, "--float8 runs with --parallel single, ddp, fsdp, tp or 2d, got pp"),
        (["--compile", "--parallel", "cp"], 2, "--compile runs with --parallel single, ddp, fsdp, tp or 2d, got cp"),
        (["--dtype", "bfloat16", "--parallel", "ep", "--moe-experts", "2"], 2, "--dtype bfloat16 runs with"),
        (["--float8", "--moe-experts", "2"], 1, "--float8 runs with the dense MLP: drop --moe-experts"),
        (["--dtype", "float16"], 1, "invalid choice"),
        (["--compile-backend", "aot_eager"], 1, "--compile-backend needs --compile"),
        (["--float8", "--parallel", "fsdp", "--resume", "CKPT_STEP_4"], 2, None),
        (["OUT_IS_A_FILE"], 1, "exists and is not a folder"),
        ([], 1, "required: --out"),
    ],
)
def test_arguments(train_gpt, tmp_path, monkeypatch, capsys, args, world_size, message):
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    (tmp_path / "file").write_text("")
    (tmp_path / "ckpt" / "step-000004").mkdir(parents=True)
    # torch.distributed.checkpoint writes .metadata last: a folder without it holds no checkpoint.
    (tmp_path / "ckpt" / "step-000004" / ".metadata").write_bytes(b"")
    (tmp_path / "ckpt" / "step-000008").mkdir()
    paths = {
        "CKPT": tmp_path / "ckpt",
        "CKPT_STEP_4": tmp_path / "ckpt",
        "CKPT_EMPTY": tmp_path / "ckpt" / "step-000008",
    }
    argv = [str(paths.get(a, a)) for a in args]
    if "--checkpoint-dir" in args and "OUT_IS_A_FILE" in args:
        argv = [str(tmp_path / "file") if a == "OUT_IS_A_FILE" else a for a in argv] + ["--out", str(tmp_path / "out")]
    elif "OUT_IS_A_FILE" in args:
        argv = [a for a in argv if a != "OUT_IS_A_FILE"] + ["--out", str(tmp_path / "file")]
    elif args:
        argv += ["--out", str(tmp_path / "out")]
    if message is None:
        parsed = train_gpt.parse_args(argv)
        assert parsed.out == tmp_path / "out"
        if "CKPT_STEP_4" in args:
            # The newest complete checkpoint: step 8 has no .metadata.
            assert (parsed.resume, parsed.start_step) == (tmp_path / "ckpt" / "step-000004", 4)
        return
    with pytest.raises(SystemExit) as exit_info:
        train_gpt.parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert message in err[-1] and sum("error" in line for line in err) == 1, err


def test_help_names_the_contract(train_gpt, capsys):
    with pytest.raises(SystemExit):
        train_gpt.parse_args(["--help"])
    text = capsys.readouterr().out
    flags = ["--variable-length", "--grad-accum", "--checkpoint-dir", "--checkpoint-every", "--resume", "--mfu"]
    flags += ["--moe-experts", "--top-k", "--capacity-factor", "--aux-loss-weight", "--sequence-parallel"]
    flags += ["--clip-grad-norm", "--slip", "--inject-nonfinite-step", "--dtype", "--float8", "--compile"]
    flags += ["--compile-backend"]
    for flag in flags:
        assert flag in text, flag
    # The layouts from the table: the choices, and a line each with the processes it runs on.
    assert "--parallel {" + ",".join(LAYOUTS) + "}" in text
    for name, layout in LAYOUTS.items():
        (line,) = [line for line in text.splitlines() if line.startswith(f"  {name} ")]
        assert layout.summary in line and str(layout.processes) in line, line


def test_throughput_and_mfu(tmp_path):
    """One short run with --mfu: metrics.json holds the throughput (tokens per step, step times, model
    FLOPs per token from the planner's formula) and the MFU against the measured peak, and the last
    line says so. No timing is compared with another: only that each is a positive time."""
    from parallel_course.planner import flops_per_token

    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), "--steps", "3", "--global-batch-size", "8", "--mfu", "--out", str(out)]
    result = run_bounded(command, timeout=120, env=job_environment())
    assert result.returncode == 0, result.stderr
    figures = json.loads((out / "metrics.json").read_text())["throughput"]
    # digits 2: 8 tokens a problem; the course's GPT: 2 layers, width 64, 12 tokens.
    assert figures["tokens_per_step"] == 8 * 8 and figures["steps_timed"] == 2
    assert figures["model_flops_per_token"] == flops_per_token(layers=2, hidden=64, seq_len=8, vocab=12)
    assert len(figures["step_times_s"]) == 3 and min(figures["step_times_s"]) > 0
    assert figures["tokens_per_s"] == pytest.approx(64 / figures["median_step_s"])
    assert len(figures["peak_flops_per_s_per_process"]) == 1 and 0 < figures["mfu"] < 1.5
    last = result.stdout.splitlines()[-1]
    assert last.startswith("throughput: 64 tokens per step") and last.endswith("x") and "MFU" in last


def test_mfu_is_opt_in(train_gpt, tmp_path):
    # Without the flag no peak is measured and nothing more is printed (the run's last line is the same).
    assert train_gpt.parse_args(["--out", str(tmp_path)]).mfu is False


# The gradient's scale: the same training in every layout, clipped in every step (the norms are
# above 1 here), on problems of mixed lengths; the runs of one process count share a launch.
CLIPPED = "--steps 6 --seed 5 --global-batch-size 16 --variable-length --clip-grad-norm 0.5"
MOE = "--moe-experts 4 --top-k 2 --capacity-factor 2"
# Each run's layout and options beyond CLIPPED, by process count and name: micro-batches in some
# (the pipelines' default is 2 per stage); the experts' layouts are compared with one process with
# the same experts; "_inject": a NaN in one rank's gradient in step 3. The same launches train the
# dense layouts with --compile and --float8 ("_compile", "_float8": the layout's own options and the
# flag), one process and 2d with --dtype bfloat16, ddp's FP8 run with a gradient half its size, and
# fsdp's FP8 run resumed from its checkpoint of step 3 ({out}: the launch's folder).
SCALE_RUNS = {
    1: {
        "single": "",
        "single_moe": MOE,
        "single_inject": "--inject-nonfinite-step 3",
        "single_compile": "--compile",
        "single_bfloat16": "--dtype bfloat16",
        "single_float8": "--float8",
    },
    2: {
        "ddp": "--grad-accum 2",
        "fsdp": "--grad-accum 2",
        "tp": "--sequence-parallel",
        "pp": "",
        "cp": "--grad-accum 2",
        "ep": MOE,
        "ddp_inject": "--inject-nonfinite-step 3",
        "ddp_compile": "--grad-accum 2 --compile",
        "fsdp_compile": "--grad-accum 2 --compile",
        "tp_compile": "--sequence-parallel --compile",
        "ddp_float8": "--grad-accum 2 --float8",
        "fsdp_float8": "--grad-accum 2 --float8 --checkpoint-dir {out}/fsdp_float8_checkpoints --checkpoint-every 3",
        "tp_float8": "--sequence-parallel --float8",
        "ddp_float8_slip": "--grad-accum 2 --float8 --slip no-dp-factor",
        "fsdp_float8_resumed": "--grad-accum 2 --float8 --resume {out}/fsdp_float8_checkpoints/step-000003",
    },
    4: {
        "2d": "--sequence-parallel --grad-accum 2",
        "dp_pp": "--grad-accum 2",
        "dp_ep": MOE,
        "2d_compile": "--sequence-parallel --grad-accum 2 --compile",
        "2d_float8": "--sequence-parallel --grad-accum 2 --float8",
        "2d_bfloat16": "--sequence-parallel --grad-accum 2 --dtype bfloat16",
    },
}
DENSE = [name for name, layout in LAYOUTS.items() if layout.dense]


def layout_of(run: str) -> str:
    """The layout a run's name starts with (dp_pp_x is dp_pp's, not dp's)."""
    return max((name for name in LAYOUTS if run == name or run.startswith(name + "_")), key=len)


@pytest.fixture(scope="module")
def scale_runs(tmp_path_factory) -> dict[str, dict]:
    """Every run of SCALE_RUNS: its metrics.json, by name. The three launches run at the same time,
    each bounded (run_bounded kills a launch and its workers together)."""
    out = tmp_path_factory.mktemp("scale")

    def launch_runs(nproc: int) -> subprocess.CompletedProcess:
        runs = SCALE_RUNS[nproc].items()
        lines = [f"--parallel {layout_of(n)} {CLIPPED} {o.format(out=out)} --out {out / n}" for n, o in runs]
        command = job_command(RUNS, None if nproc == 1 else nproc, *lines)
        return run_bounded(command, timeout=240, env=job_environment())

    with ThreadPoolExecutor(len(SCALE_RUNS)) as pool:
        for result in pool.map(launch_runs, SCALE_RUNS):
            assert result.returncode == 0, result.stderr[-3000:]
    return {
        name: json.loads((out / name / "metrics.json").read_text()) for runs in SCALE_RUNS.values() for name in runs
    }


def relative(got: list, expected: list) -> float:
    return max(abs(g / e - 1) for g, e in zip(got, expected, strict=True))


def test_every_layout_clipped_equals_one_process(scale_runs):
    """Every layout of the table, clipped in every step: its gradient norms (before clipping) and
    losses equal one process's within 1e-4, the experts' layouts against one process with experts."""
    reference = scale_runs["single"]
    assert min(reference["gradient_norms"]) > 2 * reference["clip_grad_norm"], "clipping must fire in every step"
    assert {layout_of(name) for runs in SCALE_RUNS.values() for name in runs} == set(LAYOUTS)
    for name, run in scale_runs.items():
        if name in LAYOUTS and name != "single":
            one = scale_runs["single_moe" if LAYOUTS[name].experts else "single"]
            assert len(run["gradient_norms"]) == run["steps"] == 6
            assert relative(run["gradient_norms"], one["gradient_norms"]) < 1e-4, name
            assert relative(run["losses"], one["losses"]) < 1e-4, name


def test_a_step_whose_norm_is_not_finite_is_skipped_by_every_rank(scale_runs):
    """Step 3's NaN lies in the last rank's copy of a gradient that ddp's ranks hold alike: rank 0's own
    copy is finite, yet its norm is not, and it skips the step; the training goes on as one process's
    does with the same fault, and no longer as the run without it."""
    one, ddp, clean = scale_runs["single_inject"], scale_runs["ddp_inject"], scale_runs["single"]
    for run in (one, ddp):
        assert run["gradient_norms"][2] is None and None not in run["gradient_norms"][:2] + run["gradient_norms"][3:]
    assert relative(ddp["losses"], one["losses"]) < 1e-4
    assert relative(one["losses"][:3], clean["losses"][:3]) < 1e-6
    assert relative(one["losses"][3:], clean["losses"][3:]) > 1e-3


def test_context_parallel_keeps_at_most_0_6_of_one_process_activations(train_gpt, tmp_path):
    """--parallel cp on 2 ranks: each rank's activation bytes (metrics.json's memory[*].activation_bytes,
    every tensor autograd saves, once) at most 0.6 of one process's (ring-flash keeps a rank's own
    K and V; chapter 13a's ring, which keeps every block it received, kept 0.72), with the same
    losses. One process runs here, in this process (a group of one); cp is launched."""
    run = ["--steps", "2", "--global-batch-size", "16"]
    cp = launch(job_command(SCRIPT, 2, "--parallel", "cp", *run, "--out", tmp_path / "cp"), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert train_gpt.main(["--parallel", "single", *run, "--out", str(tmp_path / "single")]) == 0
    train_gpt.teardown()
    single, split = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("single", "cp"))
    kept = [m["activation_bytes"] / single["memory"][0]["activation_bytes"] for m in split["memory"]]
    assert len(kept) == 2 and max(kept) <= 0.6, kept
    assert split["losses"] == pytest.approx(single["losses"], rel=1e-5)


def drift(run: dict, reference: dict, key: str = "losses") -> float:
    """The largest relative difference of a run's losses (or gradient norms) from a reference's."""
    return relative(run[key], reference[key])


def test_compile_equals_eager_in_every_dense_layout(scale_runs):
    """--compile (aot_eager, every block) in single, ddp, fsdp, tp and 2d: one graph for both blocks, no
    graph break, no recompile, and the losses and gradient norms of the same layout's eager run
    within 1e-4. That bound can fail: bfloat16 autocast, a smaller change than most a compiler could
    make by mistake, is outside it."""
    assert DENSE == ["single", "ddp", "fsdp", "tp", "2d"]
    for layout in DENSE:
        run, eager = scale_runs[f"{layout}_compile"], scale_runs[layout]
        assert eager["compile"] is None and eager["dtype"] == run["dtype"] == "float32"
        counted = run["compile"]
        assert counted == {"backend": "aot_eager", "graphs": 1, "graph_breaks": 0, "recompiles": 0}, layout
        assert drift(run, eager) < 1e-4 and drift(run, eager, "gradient_norms") < 1e-4, layout
    bfloat16 = scale_runs["single_bfloat16"]
    assert bfloat16["dtype"] == "bfloat16"
    assert drift(bfloat16, scale_runs["single"], "gradient_norms") > 1e-4


def float8_tolerances(scale_runs) -> dict[str, float]:
    """tau for the losses and for the gradient norms: 32 times bfloat16's drift from float32 on the
    same training (chapter 17a: float8.tolerance)."""
    from parallel_course import float8

    bfloat16, float32 = scale_runs["single_bfloat16"], scale_runs["single"]
    return {key: float8.tolerance(drift(bfloat16, float32, key)) for key in ("losses", "gradient_norms")}


def test_float8_trains_apart_from_float32_and_within_tau_of_bfloat16(scale_runs):
    """--float8 on one process: torchao converts the blocks' twelve linears (the head, 64 x 12, is
    no multiple of 16), the loss falls, it differs from float32 by more than bfloat16 does (the casts
    are there: the negative control that the flag did something), and by at most tau from bfloat16's
    losses and gradient norms."""
    float32, bfloat16, run = scale_runs["single"], scale_runs["single_bfloat16"], scale_runs["single_float8"]
    linears = [f"blocks.{b}.{name}" for b in (0, 1) for name in ("attn.q", "attn.k", "attn.v", "attn.proj")]
    linears += [f"blocks.{b}.mlp.{name}" for b in (0, 1) for name in ("fc", "proj")]
    assert sorted(run["float8"]["converted_linears"]) == sorted(linears) and float32["float8"] is None
    assert run["losses"][-1] < run["losses"][0]
    tau = float8_tolerances(scale_runs)
    for key in ("losses", "gradient_norms"):
        assert drift(run, float32, key) > drift(bfloat16, float32, key), key
        assert drift(run, bfloat16, key) <= tau[key], (key, drift(run, bfloat16, key), tau[key])


def test_float8_layouts_equal_their_single_process_within_2_tau(scale_runs):
    """--float8 in ddp, fsdp (FP8 all-gathers), tp and 2d against one process's --float8. Not equal
    up to float rounding: each data-parallel rank scales its own share of the activations by its own
    amax, so the layouts round differently from the first step (chapter 17a). Each run is within tau
    of the same training in float32 (tau derived for one run: test above), so two FP8 runs of it are
    within tau + tau of each other (|a/c - 1|, |b/c - 1| <= tau gives |a/b - 1| <= 2 tau / (1 - tau),
    about 2 tau), for losses and gradient norms. The negative control: ddp's gradient half its size (--slip
    no-dp-factor) keeps its losses (AdamW and clipping hide the factor) and fails on the norms."""
    tau, one = float8_tolerances(scale_runs), scale_runs["single_float8"]
    bound = {key: 2 * t / (1 - t) for key, t in tau.items()}
    for layout in ("ddp", "fsdp", "tp", "2d"):
        run = scale_runs[f"{layout}_float8"]
        assert run["float8"]["converted_linears"] == one["float8"]["converted_linears"], layout
        assert run["float8"]["fsdp_float8_all_gather"] == (layout in ("fsdp", "2d")), layout
        for key in ("losses", "gradient_norms"):
            assert drift(run, one, key) <= bound[key], (layout, key, drift(run, one, key), bound[key])
    slipped = scale_runs["ddp_float8_slip"]
    assert drift(slipped, one) <= bound["losses"]
    assert drift(slipped, one, "gradient_norms") > bound["gradient_norms"]


def test_float8_under_fsdp_resumes_as_if_never_stopped(scale_runs):
    """fsdp's FP8 run resumed from its checkpoint of step 3 (the model built on the meta device, its
    shards and AdamW's state loaded): steps 4 to 6 bit for bit the run's own, losses and gradient norms.
    The FP8 all-gathers' scales must be the loaded weights': computed in the optimizer's step, as
    torchtitan does, they would be those of the weights before the load (DCP steps the optimizer
    once to make its state), and the resumed losses NaN."""
    whole, resumed = scale_runs["fsdp_float8"], scale_runs["fsdp_float8_resumed"]
    assert resumed["start_step"] == 3 and [save["step"] for save in whole["checkpoints"]] == [3, 6]
    for key in ("losses", "gradient_norms"):
        assert resumed[key] == whole[key][3:], key


def test_bfloat16_in_2d_equals_one_process_within_2_deltas(scale_runs):
    """--dtype bfloat16 in 2d (autocast under TP and FSDP) against one process's: the same training as
    float32 (2d's float32 run equals one process's within 1e-4, above), rounded to bfloat16 in a
    different order. Each bfloat16 run drifts from float32 by about bfloat16's drift delta (measured
    on one process), so the two differ by at most delta + delta, losses and gradient norms alike;
    and 2d's own bfloat16 run is no float32 run (its gradient norms drift from them by more than 1e-4)."""
    float32, one, run = scale_runs["single"], scale_runs["single_bfloat16"], scale_runs["2d_bfloat16"]
    assert run["dtype"] == "bfloat16" and run["compile"] is None and run["float8"] is None
    for key in ("losses", "gradient_norms"):
        assert drift(run, one, key) <= 2 * drift(one, float32, key), (key, drift(run, one, key))
    assert drift(run, scale_runs["2d"], "gradient_norms") > 1e-4
