"""parallel_course.memory_tracking: torch's tracker on the capstone's GPT in a group of one, every byte
its forward leaves explained (forward_leaves), the accounting beside it; selective checkpointing's
recomputation counted (and the policy that matches no Linear caught); offload's bytes counted (and
the weights moved too caught); the figure of the tracked peaks."""

import pytest
import torch
from matplotlib.figure import Figure

from parallel_course import memory_figures, transformer_memory
from parallel_course import memory_tracking as mt
from parallel_course.gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum


def test_single_layout_tracked_every_byte_after_forward_explained():
    with mt.group_of_one():
        run = mt.track_layout("single", iterations=2)
    elements, tensors = run["parameter_elements"], run["parameter_tensors"]
    assert (elements, tensors) == (102656, 37)
    step = run["peaks"][-1]
    after, peak = step["after_forward"], mt.by_part(step["peak"])
    # fp32 weights; AdamW: two moments per weight and a 4-byte step count per tensor.
    assert peak["parameters"] == after["Parameter"] == 4 * elements
    assert peak["optimizer"] == after["Optstate"] == 8 * elements + 4 * tensors
    leaves = mt.forward_leaves("single", run["tokens"], positions_tracked=True)
    assert after["Activation"] == sum(leaves.values())
    # The peak: early in backward, the part outside the blocks freed, the head's and final norm's
    # gradients made (vocabulary x width, and the norm's weight and bias).
    assert peak["activations"] == after["Activation"] - leaves["outside the blocks"]
    assert peak["gradients"] == 4 * (12 * 64 + 2 * 64)
    assert peak["total"] == sum(v for k, v in peak.items() if k != "total")


def test_least_takes_the_smallest_steady_snapshot():
    def step(total):
        return {"peak": {"Total": total}, "after_forward": {"Total": total - 1}}

    ranks = [{"peaks": [step(1), step(9), step(7)]}, {"peaks": [step(2), step(8), step(10)]}]
    assert mt.least(ranks) == {"Total": 7} and mt.least(ranks, "after_forward") == {"Total": 6}
    with pytest.raises(ValueError, match="at least 2"):
        mt.least([{"peaks": [step(1)]}])


def test_accounting_of_the_layouts():
    params = transformer_memory.parameters(mt.CAPSTONE_SHAPE)
    single = mt.accounting("single")
    assert single["chapter 11"]["parameters"] == 4 * sum(params.values())
    assert single["planner"]["parameters"] == 2 * mt.CAPSTONE.params() == 2 * sum(params.values())
    assert single["planner"]["optimizer"] == 12 * mt.CAPSTONE.params()
    fsdp = mt.accounting("fsdp")
    assert fsdp["chapter 11"]["parameters"] == single["chapter 11"]["parameters"] / 2
    # One tracked layout's forward_leaves, split the way it splits.
    assert mt.forward_leaves("tp", 128, True)["blocks"] < mt.forward_leaves("single", 128, True)["blocks"]
    assert mt.forward_leaves("cp", 64, False)["ids and loss"] == 8 * 64 + 8


def gpt(checkpointing=None):
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    if checkpointing == "full":
        mt.checkpoint_blocks(model)
    elif checkpointing is not None:
        mt.checkpoint_blocks(model, checkpointing)
    return model


def test_selective_checkpointing_recomputes_every_second_matmul_but_the_last():
    x, y = AdditionTask(2).batch(torch.Generator().manual_seed(1), 4)
    tokens, h = x.numel(), 64
    base = mt.step_costs(gpt, x, y)
    sac = mt.step_costs(lambda: gpt(mt.every_second_matmul_policy), x, y)
    full = mt.step_costs(lambda: gpt("full"), x, y)
    assert torch.equal(sac["grads"], base["grads"]) and torch.equal(full["grads"], base["grads"])
    assert base["kept"] > sac["kept"] > full["kept"]
    # The 2nd and 4th matmuls of each block (k, and attention's projection) run again; the 6th (the
    # MLP's projection) does not: nothing the block's backward needs comes after it.
    assert sac["flops"] - base["flops"] == 2 * tokens * 2 * (h * h + h * h)
    # The policy written for aten.mm matches no Linear with a bias (they run as aten.addmm): it saves
    # only attention's output and recomputes every matmul, as full checkpointing.
    mm_only = mt.step_costs(lambda: gpt(lambda: mt.every_second_matmul_policy((torch.ops.aten.mm.default,))), x, y)
    assert mm_only["flops"] - base["flops"] == full["flops"] - base["flops"] == 2 * tokens * 2 * 8 * h * h


def grads_of(model, x, y):
    answer_loss_sum(model(x), y)[0].backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_offload_moves_the_activations_and_gives_the_same_gradients():
    x, y = AdditionTask(2).batch(torch.Generator().manual_seed(1), 4)
    model = gpt()
    saved = mt.saved_tensor_bytes(model, lambda: answer_loss_sum(model(x), y))
    grads = grads_of(gpt(), x, y)
    for weights_too in (False, True):
        model = gpt()
        offload = mt.Offload(model, weights_too=weights_too)
        with offload.hooks():
            got = grads_of(model, x, y)
        assert torch.equal(got, grads)
        assert offload.bytes_out == offload.bytes_back
        assert (offload.bytes_out == saved) != weights_too


def test_plot_peak_parts_stacks_each_part_of_each_layout():
    ax = Figure().subplots()
    peaks = {"single": {"parameters": 2000, "activations": 1000}, "ddp": {"parameters": 2000, "gradients": 500}}
    memory_figures.plot_peak_parts(ax, peaks)
    assert len(ax.patches) == len(memory_figures.PART_COLOURS) * 2
    tops = {(round(p.get_x() + p.get_width() / 2), p.get_y() + p.get_height()) for p in ax.patches}
    assert (0, 3.0) in tops and (1, 2.5) in tops
