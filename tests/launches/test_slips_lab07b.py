"""Lab 07b's checker names the slip injected into the solution: each variant's FAIL line says it.

All variants run in one launch on 2 processes (tests/slip_driver.py).
"""

import pytest

from slip_injection import assert_fail_names, check_variants, lab_folder

SOLUTION = "lab07_tensor_parallel_linear.ipynb"
COLUMN_WEIGHT = "self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=0)[rank].clone())"
COLUMN_BIAS = "self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, dim=0)[rank].clone())"
ROW_WEIGHT = "self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=1)[rank].clone())"
ROW_BIAS = "self.bias = nn.Parameter(linear.bias.detach().clone())"
ROW_OUTPUT = "return SumShards.apply(F.linear(x, self.weight)) + self.bias"
GATHERED = "return GatherShards.apply(y) if self.gather_output else y"
SCATTERED = "if not self.input_is_sharded:\n            x = ScatterToShards.apply(x)"
# slip -> (substitutions on the solution's lab07_tp.py, the words a FAIL line must hold).
SLIPS = {
    "column_split_by_inputs": (
        [(COLUMN_WEIGHT, COLUMN_WEIGHT.replace("dim=0", "dim=1"))],
        "ColumnParallelLinear: this rank's parameters: rank 0: expected weight (16, 16) and bias (16,), got "
        "weight (32, 8) and bias (16,): W is split along its input features (dim 1)",
    ),
    "row_split_by_outputs": (
        [(ROW_WEIGHT, ROW_WEIGHT.replace("dim=1", "dim=0"))],
        "W is split along its output features (dim 0)",
    ),
    "column_bias_whole": ([(COLUMN_BIAS, ROW_BIAS)], "the whole bias: in a column-parallel layer"),
    "row_bias_split": ([(ROW_BIAS, COLUMN_BIAS)], "a slice of the bias: a row-parallel layer"),
    "column_not_gathered": (
        [("return GatherShards.apply(y) if self.gather_output else y", "return y")],
        "ColumnParallelLinear output: rank 0: expected shape (4, 32), got (4, 16): only this rank's slice of the "
        "output features: with gather_output=True the ranks' slices are gathered into the whole output",
    ),
    "column_input_not_copied": (
        [("F.linear(CopyToShards.apply(x), self.weight, self.bias)", "F.linear(x, self.weight, self.bias)")],
        "ColumnParallelLinear input gradient: rank 0: max |difference| = ",
    ),
    "row_bias_on_every_rank": (
        [(ROW_OUTPUT, "return SumShards.apply(F.linear(x, self.weight, self.bias))")],
        "RowParallelLinear output: rank 0: max |difference| = ",
    ),
    "row_not_summed": (
        [(ROW_OUTPUT, "return F.linear(x, self.weight) + self.bias")],
        "the partial results are not summed over the ranks",
    ),
    "row_sliced_without_scatter": (
        [("x = ScatterToShards.apply(x)", "x = x.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()]")],
        "the input gradient holds only this rank's slice of the features",
    ),
    "column_strided": (
        [
            (COLUMN_WEIGHT, COLUMN_WEIGHT.replace(".chunk(world_size, dim=0)[rank]", "[rank::world_size]")),
            (COLUMN_BIAS, COLUMN_BIAS.replace(".chunk(world_size, dim=0)[rank]", "[rank::world_size]")),
        ],
        "the right output features in another order: rank r's slice must be chunk r of the features (torch.chunk "
        "order); here feature 1 is the expected feature 2",
    ),
    # What tensor parallelism is for, skipped: a rank keeps the whole weight alive.
    "column_weight_a_view": (
        [(COLUMN_WEIGHT, COLUMN_WEIGHT.replace(".clone())", ")"))],
        "ColumnParallelLinear: this rank's parameters: rank 0: expected 1,088 bytes held (its slices), got 2,112: "
        "its weight is a view into the whole weight",
    ),
    "the_layer_kept": (
        [(ROW_BIAS, ROW_BIAS + "\n        self.linear = linear")],
        "RowParallelLinear: this rank's parameters: rank 0: expected 1,152 bytes held (its slices), got 3,328: it "
        "keeps more than its slices",
    ),
    # The flags ignored: the hidden features gathered, then cut again.
    "flags_ignored": (
        [(GATHERED, "return GatherShards.apply(y)"), (SCATTERED, "x = ScatterToShards.apply(x)")],
        "MLP: collectives counted: rank 0: expected forward: all_reduce of 32 elements; backward: all_reduce of 64 "
        "elements, got forward: all_gather of 64 elements, all_reduce of 32 elements; backward: all_gather of 64 "
        "elements, all_reduce of 64 elements: an all_gather: does the column layer gather its output",
    ),
}
# Where the first words above name the check and a number, the slip's own words follow.
ALSO = {
    "column_input_not_copied": "only its own contribution",
    "row_bias_on_every_rank": "the bias is added on every rank before the partial results are summed: 2 times",
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab07b"))
    slips = {name: substitutions for name, (substitutions, _) in SLIPS.items()}
    return check_variants(folder, "lab07_tp_check.py", "lab07_tp", slips)


@pytest.mark.parametrize("slip", SLIPS)
def test_the_fail_line_names_the_slip(checked, slip):
    assert_fail_names(checked[slip], SLIPS[slip][1], ALSO.get(slip, ""))
