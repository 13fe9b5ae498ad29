"""parallel_course.gpt: the capstone's GPT and its addition task (chapter 11)."""

import pytest
import torch
import torch.nn.functional as F

from parallel_course.gpt import (
    EQUALS,
    GPT,
    IGNORE,
    PLUS,
    AdditionTask,
    GPTConfig,
    answer_loss_sum,
    exact_match,
    parameter_count,
)


def number(digits):
    return int("".join(str(d) for d in digits.tolist()))


@pytest.mark.parametrize("n_digits", [1, 2, 3])
def test_addition_batches_are_correct_sums(n_digits):
    task = AdditionTask(n_digits)
    x, y = task.batch(torch.Generator().manual_seed(0), 50)
    assert x.shape == y.shape == (50, task.seq_len)
    n = n_digits
    assert (x[:, n] == PLUS).all() and (x[:, 2 * n + 1] == EQUALS).all()
    assert (y[:, : -task.answer_len] == IGNORE).all()
    for xs, ys in zip(x, y):
        a, b = number(xs[:n]), number(xs[n + 1 : 2 * n + 1])
        assert number(ys[-task.answer_len :].flip(0)) == a + b  # the answer, least significant digit first
        assert task.show(xs, ys[-task.answer_len :]) == f"{a:0{n}d}+{b:0{n}d}={a + b:0{n + 1}d}"
    # the next-token targets are the inputs shifted by one
    assert torch.equal(x[:, 1:][y[:, :-1] != IGNORE], y[:, :-1][y[:, :-1] != IGNORE])


def test_batches_depend_on_the_generator_only():
    task = AdditionTask(2)
    a = task.batch(torch.Generator().manual_seed(3), 8)
    torch.manual_seed(99)  # the global generator plays no part
    b = task.batch(torch.Generator().manual_seed(3), 8)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    c = task.batch(torch.Generator().manual_seed(4), 8)
    assert not torch.equal(a[0], c[0])


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n_digits"):
        AdditionTask(0)
    with pytest.raises(ValueError, match="divisible"):
        GPT(GPTConfig(d_model=60, n_heads=8))
    with pytest.raises(ValueError, match="block_size"):
        GPT(GPTConfig(block_size=4))(torch.zeros(1, 5, dtype=torch.long))


def test_attention_is_causal():
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    x = torch.randint(0, 12, (2, 8))
    changed = x.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 12
    with torch.no_grad():
        assert torch.equal(model(x)[:, :5], model(changed)[:, :5])
        assert not torch.allclose(model(x)[:, 5:], model(changed)[:, 5:])


def test_activation_checkpointing_changes_nothing_computed():
    torch.manual_seed(0)
    plain = GPT(GPTConfig())
    checkpointed = GPT(GPTConfig(), activation_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    x, y = AdditionTask(2).batch(torch.Generator().manual_seed(0), 16)
    for model in (plain, checkpointed):
        loss, _ = answer_loss_sum(model(x), y)
        loss.backward()
    for p, q in zip(plain.parameters(), checkpointed.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-6)


def test_loss_sum_over_count_is_the_mean_over_answer_positions():
    torch.manual_seed(0)
    task = AdditionTask(2)
    x, y = task.batch(torch.Generator().manual_seed(1), 10)
    logits = GPT(GPTConfig())(x)
    total, count = answer_loss_sum(logits, y)
    assert count == 10 * task.answer_len
    mean = F.cross_entropy(logits[:, -task.answer_len :].reshape(-1, 12), y[:, -task.answer_len :].reshape(-1))
    assert torch.allclose(total / count, mean)


def test_exact_match_is_greedy_decoding_right():
    torch.manual_seed(0)
    task = AdditionTask(1)
    model = GPT(GPTConfig())
    # A lightly trained model: some sums right, some wrong.
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        x, y = task.batch(g, 64)
        loss, count = answer_loss_sum(model(x), y)
        (loss / count).backward()
        optimizer.step()
        optimizer.zero_grad()
    x, y = task.batch(torch.Generator().manual_seed(5), 200)
    with torch.no_grad():
        seq = x[:, : -task.answer_len + 1]  # the problem, up to and including "="
        for _ in range(task.answer_len):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        greedy_right = (seq[:, -task.answer_len :] == y[:, -task.answer_len :]).all(dim=1)
        matched = exact_match(model(x), y)
    assert 0 < int(matched.sum()) < len(matched), "the check needs right and wrong answers"
    assert torch.equal(matched, greedy_right)


def test_the_default_model_is_small():
    assert parameter_count(GPT(GPTConfig())) == 102_656
