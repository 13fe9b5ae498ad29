"""Lab 15's in-kernel checks name each slip injected into the solution's lab15_norm.py, and pass other
right answers.

The check cells run here as the kernel runs them (one process on this thread, then 12 ranks of dp 3 ×
tp 2 × pp 2 on threads, the collectives simulated), with the solution's lab15_norm.py, a slip injected,
as the module they import; no process is launched. A rank that leaves the others waiting is named at
once. The launched checker with slips injected: tests/launches/test_slips_lab15.py; the recognisers on
results made by hand: tests/unit/test_slips_global_norm.py.
"""

import importlib
import sys

import pytest

from lab15_edits import DP, GRADIENTS_GATHERED, OWN_TEST, PP, SKIP, TP
from lab_injection import kernel_in, region, run_cell
from parallel_course.checks import CheckFailed
from parallel_course.slips.global_norm import check_clip, check_global_norm
from slip_injection import code_cell, inject, lab_folder

SOLUTION = "lab15_global_norm.ipynb"
NORM_CHECK = "check_global_norm(lab15_norm.global_norm)"
CLIP_CHECK = "check_clip(lab15_norm.clip_)"
ONE = "FAIL global_norm on 1 rank (dp 1 × tp 1 × pp 1), one training step's gradient: "
STEP = "FAIL global_norm on 12 ranks (dp 3 × tp 2 × pp 2), one training step's gradient: expected torch's norm"
CLIP = "FAIL clip_ on 12 ranks (dp 3 × tp 2 × pp 2), "
INF = CLIP + "an inf in expert 5 (held by dp rank 2) (1.533, max_norm 0.7666): "
ROOT = "    return stage.sqrt()"
NORM = "    norm = global_norm(pieces, layout)\n"
SAME = "    # The same norm on every rank: every rank decides alike.\n"
SCALE = "        piece.grad.mul_(coefficient)"
# slip -> (substitutions on the solution's lab15_norm.py, the start of the FAIL line, the words it must hold).
NORM_SLIPS = {
    # The point skipped: each rank's own norm.
    "a rank's local norm": ([(TP, ""), (DP, ""), (PP, "")], STEP, "a rank's local norm only"),
    "replicated counted N times: every square summed over all ranks": (
        [(TP, TP.replace(", group=layout.tp.group", "")), (DP, ""), (PP, "")],
        STEP,
        "replicated parameters counted 3 times: the 3 dp ranks each hold the same piece",
    ),
    "replicated counted N times: the tp copies summed over tp": (
        [("squares[piece.kind] += ", 'squares["tp_split" if piece.kind == "tp_replicated" else piece.kind] += ')],
        STEP,
        "replicated parameters counted 2 times: a tp_replicated tensor is the same on each of the 2 tp ranks",
    ),
    "stages never reduced": ([(PP, "")], STEP, "stages never reduced"),
    "tp pieces never reduced": ([(TP, "")], STEP, "the tp pieces never reduced"),
    "experts counted on every rank": (
        [(DP, DP.replace(", group=layout.dp.group", ""))],
        STEP,
        "experts counted on every rank: each expert was counted 4 times",
    ),
    "experts never reduced": ([(DP, "")], STEP, "the experts never reduced"),
    "norms added instead of their squares": (
        [(PP + ROOT, "    stage = stage.sqrt()\n" + PP + "    return stage")],
        STEP,
        "norms added instead of their squares, across the stages: 3 + 4 = 7, not √(3² + 4²) = 5",
    ),
    "averaged over the stages": (
        [(PP, PP.replace("(stage, ", "(stage, op=dist.ReduceOp.AVG, "))],
        STEP,
        "averaged where it should add: a sum of squares reduced with ReduceOp.AVG (÷2)",
    ),
    "no square root": ([(ROOT, "    return stage")], ONE, "that is the square of the norm"),
    # The point skipped: each tp rank gathers the whole tensors and takes their norm (the right number).
    "gradients gathered": (
        GRADIENTS_GATHERED,
        "FAIL global_norm's collectives: a rank gave them 274 elements in all",
        "the norm needs only sums of squares",
    ),
    "a collective only where the experts' squares are not zero": (
        [(DP, '    if squares["expert"] > 0:\n    ' + DP)],
        "FAIL global_norm on 12 ranks (dp 3 × tp 2 × pp 2), a gradient non-zero only in one expert, held by dp rank 0: "
        "the ranks wait forever (rank 4 returned after 2 collective call(s);",
        "every rank must call the same collectives on each of its groups, in the same order",
    ),
    "gathered as Python objects": (
        [
            (
                TP,
                "    shares = [None] * layout.tp.size\n"
                '    dist.all_gather_object(shares, squares["tp_split"].item(), group=layout.tp.group)\n'
                '    squares["tp_split"] = torch.tensor(sum(shares))\n',
            )
        ],
        "FAIL global_norm on 1 rank (dp 1 × tp 1 × pp 1): global_norm calls dist.all_gather_object",
        "this lab's code needs only dist.all_reduce",
    ),
}
CLIP_SLIPS = {
    "clipped with the local norm": (
        [(NORM, "    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in pieces))\n")],
        CLIP + "a norm above max_norm (1.533, max_norm 0.7666): expected every piece scaled as torch",
        "clipped with each rank's local norm: the ranks scale by different factors",
    ),
    "coefficient not clamped at 1": (
        [("torch.clamp(max_norm / (norm + 1e-6), max=1.0)", "max_norm / (norm + 1e-6)")],
        CLIP + "a norm below max_norm (1.533, max_norm 3.067): expected every piece left as it was",
        "the gradients grew ×2 = max_norm / norm: clamp the coefficient at 1",
    ),
    "each rank tests its own gradients": (
        [(SKIP, OWN_TEST)],
        INF + "expected False (skip the step) on every rank, got True on rank(s) [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], "
        "False on rank(s) [10, 11]",
        "each rank tested its own gradients",
    ),
    "a rank with a non-finite gradient leaves before the norm": (
        [(NORM + SAME + SKIP, OWN_TEST + NORM)],
        INF + "the ranks wait forever (rank 10 returned after 0 collective call(s); rank 11 returned after 0 "
        "collective call(s);",
        "whatever its own gradients hold",
    ),
    "a non-finite norm not skipped": ([(SKIP, "")], INF + "expected False", "a non-finite norm not skipped"),
    "the copies of replicated tensors left unscaled": (
        [(SCALE, '        if piece.kind != "tp_replicated" or layout.tp.rank == 0:\n    ' + SCALE)],
        CLIP + "a norm above max_norm",
        "rank 1 scaled its pieces by different factors (0.5 to 1; its tp_replicated pieces off)",
    ),
    "not in place": (
        [(SCALE, "        piece.grad * coefficient")],
        "FAIL clip_ on 1 rank (dp 1 × tp 1 × pp 1), a norm above max_norm",
        "the gradients were not changed: clip_ scales the pieces it is given in place",
    ),
    # torch's clip_grad_norm_ returns the norm.
    "the norm returned": (
        [("    return True", "    return norm")],
        "FAIL clip_ on 1 rank (dp 1 × tp 1 × pp 1), a norm above max_norm (1.533, max_norm 0.7666): clip_ returned "
        "Tensor",
        "return True (the optimizer may step) or False (skip the step)",
    ),
}


def check_cells(tmp_path, substitutions):
    """The two check cells, run on the solution's file with ``substitutions`` made: the message of the
    first FAIL, or None when both pass."""
    work = lab_folder(SOLUTION, tmp_path / "work")
    student = work / "lab15_norm.py"
    student.write_text(inject(student.read_text(), substitutions))
    with kernel_in(tmp_path):
        # The lab's setup cell puts work/ on the path and imports the checks.
        sys.path.insert(0, str(work))
        namespace = {"importlib": importlib, "check_global_norm": check_global_norm, "check_clip": check_clip}
        try:
            for cell in (NORM_CHECK, CLIP_CHECK):
                run_cell(code_cell(SOLUTION, cell), namespace)
        except CheckFailed as failed:
            return str(failed)
    return None


@pytest.mark.parametrize("slip", [*NORM_SLIPS, *CLIP_SLIPS])
def test_the_check_names_the_slip(tmp_path, slip):
    substitutions, start, named = {**NORM_SLIPS, **CLIP_SLIPS}[slip]
    message = check_cells(tmp_path, substitutions)
    assert message.startswith(start), message
    assert named in message, message


# Other right answers: the checks must pass them.
SOLVED = region(code_cell(SOLUTION, "def global_norm("))
OTHER_ANSWERS = {
    # One all-reduce over every rank, each copy counted by one rank only; a float64 sum.
    "one all-reduce": [
        (
            SOLVED,
            "    mine = torch.zeros((), dtype=torch.float64, device=pieces[0].grad.device)\n"
            "    for piece in pieces:\n"
            '        if piece.kind == "tp_split":\n'
            "            counts = layout.dp.rank == 0\n"
            '        elif piece.kind == "tp_replicated":\n'
            "            counts = layout.dp.rank == 0 and layout.tp.rank == 0\n"
            "        else:\n"
            "            counts = layout.tp.rank == 0\n"
            "        if counts:\n"
            "            mine += piece.grad.double().pow(2).sum()\n"
            "    dist.all_reduce(mine)\n"
            "    return mine.sqrt()\n",
        )
    ],
    # The tp and dp all-reduces started together, then waited for.
    "asynchronous": [
        (TP, '    works = [dist.all_reduce(squares["tp_split"], group=layout.tp.group, async_op=True)]\n'),
        (
            DP,
            '    works.append(dist.all_reduce(squares["expert"], group=layout.dp.group, async_op=True))\n'
            "    for work in works:\n"
            "        work.wait()\n",
        ),
    ],
}


@pytest.mark.parametrize("answer", OTHER_ANSWERS)
def test_other_right_answers_pass(tmp_path, answer, capsys):
    assert check_cells(tmp_path, OTHER_ANSWERS[answer]) is None
    assert capsys.readouterr().out.count("PASS") == 9


def test_an_unwritten_function_is_named(tmp_path):
    with pytest.raises(NotImplementedError, match="global_norm is not written yet"):
        check_cells(tmp_path, [(SOLVED, "    raise NotImplementedError()\n")])
