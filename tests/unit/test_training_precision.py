"""parallel_course.training.precision, what train_gpt.py's --dtype, --float8 and --compile do, in one
process (a gloo group of one where FSDP2 needs a group): the layouts they run in, the FP8 linears
converted before the layout and under FSDP2 gathered in eight bits with their scales precomputed
after every step, the activations autograd saves counted through torchao's tensors, every block
compiled into one graph that computes what the eager model does, autocast, and what metrics.json
records of each. The launches (every dense layout against its eager, float32 and bfloat16 runs)
are tests/launches/test_train_gpt.py's."""

import types

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from parallel_course.gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum
from parallel_course.training import step_metrics
from parallel_course.training.layouts import LAYOUTS
from parallel_course.training.parallelize import apply_fsdp
from parallel_course.training.precision import Precision

# The capstone's linears FP8 takes: every block's q, k, v, attention projection, fc and MLP projection
# (the head, 64 -> 12, is no multiple of 16).
BLOCK_LINEARS = ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj")


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig())


def loss_and_grads(model, x, y) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss_sum, count = answer_loss_sum(model(x), y)
    (loss_sum / count).backward()
    return loss_sum.detach() / count, [p.grad.clone() for p in model.parameters()]


def batch(n: int = 8):
    return AdditionTask(2).batch(torch.Generator().manual_seed(1), n)


def on(name: str):
    """A layout's meshes as Precision reads them (its row of the table only)."""
    return types.SimpleNamespace(layout=LAYOUTS[name])


def arguments(**given) -> types.SimpleNamespace:
    options = dict(dtype="float32", float8=False, compile=False, compile_backend=None, moe_experts=0, resume=None)
    return types.SimpleNamespace(**{**options, **given})


def test_the_dense_layouts_take_the_flags_and_the_others_refuse_them_in_one_line():
    assert [name for name, layout in LAYOUTS.items() if layout.dense] == ["single", "ddp", "fsdp", "tp", "2d"]
    for name, layout in LAYOUTS.items():
        refused = Precision.refusal(arguments(float8=True, compile=True), layout)
        assert (refused is None) == layout.dense, name
    assert Precision.refusal(arguments(dtype="bfloat16"), LAYOUTS["cp"]) == (
        "--dtype bfloat16 runs with --parallel single, ddp, fsdp, tp or 2d, got cp"
    )
    assert "drop --moe-experts" in Precision.refusal(arguments(compile=True, moe_experts=4), LAYOUTS["single"])
    assert Precision.refusal(arguments(compile_backend="inductor"), LAYOUTS["single"]) == (
        "--compile-backend needs --compile"
    )
    assert Precision.refusal(arguments(float8=True, resume="ckpt"), LAYOUTS["2d"]) is None
    # Without a flag, nothing done and nothing recorded but the dtype.
    plain = Precision.of(arguments())
    assert plain.record() == {"dtype": "float32", "compile": None, "float8": None}
    assert Precision.of(arguments(compile=True)).compile_backend == "aot_eager"


def test_autocast_runs_the_forward_in_bfloat16_only_when_asked():
    layer, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
    with Precision("bfloat16").autocast("cpu"):
        assert layer(x).dtype == torch.bfloat16
    with Precision("float32").autocast("cpu"):
        assert layer(x).dtype == torch.float32


def test_float8_converts_the_blocks_linears_and_their_activations_are_counted():
    """One process: twelve linears converted, recorded by name; the first step's saved-activation count
    reads through torchao's float8 tensors (an FP8 linear keeps its eight-bit casts for backward, whose
    own untyped_storage() raises), and the loss is near float32's, not equal to it."""
    model, x, y = gpt(), *batch()
    precision = Precision(float8=True)
    precision.convert(model, on("single"), torch.device("cpu"))
    linears = [f"blocks.{b}.{name}" for b in (0, 1) for name in BLOCK_LINEARS]
    assert precision.float8_linears == linears and not precision.float8_gather
    assert precision.record()["float8"]["converted_linears"] == linears
    saved = step_metrics.SavedActivations(model)
    with saved.hooks():
        loss, _ = loss_and_grads(model, x, y)
    reference, _ = loss_and_grads(gpt(), x, y)
    assert saved.bytes > 0
    assert 0 < abs(loss / reference - 1) < 1e-2


def test_float8_under_fsdp_gathers_eight_bits_with_scales_computed_once_the_weights_change(group):
    """FSDP2 in a group of one: the FP8 weights' shards are torchao's wrapper (gathered in eight bits),
    the saved activations are counted through the gathered Float8TrainingTensor, and the scales are
    precomputed before the first forward and again before the first forward after an optimizer step
    (not in the step: loading a checkpoint steps the optimizer before the weights arrive), each the
    format's max over the weight's amax as it is then."""
    model, x, y = gpt(), *batch()
    precision = Precision(float8=True)
    precision.convert(model, on("fsdp"), torch.device("cpu"))
    apply_fsdp(model, init_device_mesh("cpu", (1,)))
    assert precision.float8_gather and precision.record()["float8"]["fsdp_float8_all_gather"]
    weight = model.blocks[0].attn.q.weight._local_tensor
    assert type(weight).__name__ == "WeightWithDynamicFloat8CastTensor"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    precision.keep_scales(optimizer, model)

    def scale_of_the_weight_now():
        return torch.finfo(torch.float8_e4m3fn).max / weight._tensor.abs().max().double().item()

    assert weight._precomputed_scale is None
    saved = step_metrics.SavedActivations(model)
    with saved.hooks():
        loss_and_grads(model, x, y)
    assert saved.bytes > 0
    first = weight._precomputed_scale.item()
    assert first == pytest.approx(scale_of_the_weight_now(), rel=1e-6)
    optimizer.step()
    optimizer.zero_grad()
    # The weights moved; the scale is computed again at the next forward, not before.
    assert weight._precomputed_scale.item() == first != pytest.approx(scale_of_the_weight_now(), rel=1e-6)
    loss_and_grads(model, x, y)
    assert weight._precomputed_scale.item() == pytest.approx(scale_of_the_weight_now(), rel=1e-6)


def test_compile_makes_one_graph_for_both_blocks_equal_to_eager():
    """Every block compiled (aot_eager): one graph serves both, no break, no recompile, and the loss and
    every gradient equal the eager model's bit for bit. (That each training of a launch counts its own
    graphs afresh, the launches show: three compiled layouts in one, each with its graph.)"""
    x, y = batch()
    eager_loss, eager_grads = loss_and_grads(gpt(), x, y)
    model, precision = gpt(), Precision(compile_backend="aot_eager")
    precision.compile(model)
    loss, grads = loss_and_grads(model, x, y)
    assert precision.record()["compile"] == {"backend": "aot_eager", "graphs": 1, "graph_breaks": 0, "recompiles": 0}
    assert torch.equal(loss, eager_loss) and all(map(torch.equal, grads, eager_grads))
