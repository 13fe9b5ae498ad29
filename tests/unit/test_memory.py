"""Memory accounting (parallel_course.memory) and the ZeRO calculator widget."""

import pytest
import torch
import torch.nn as nn

from parallel_course import memory


def test_sixteen_bytes_per_parameter_either_way():
    assert memory.bytes_per_parameter("mixed") == {"weights": 2, "gradients": 2, "optimizer states": 12, "total": 16}
    assert memory.bytes_per_parameter("fp32") == {"weights": 4, "gradients": 4, "optimizer states": 8, "total": 16}


def test_zero_paper_figure_1():
    # Rajbhandari et al. 2020, Figure 1: 7.5 B parameters, N_d = 64, K = 12.
    table = memory.per_rank_table(7.5e9, 64, "mixed")
    assert [round(v / memory.GB, 1) for v in table.values()] == [120.0, 31.4, 16.6, 1.9]
    assert list(table) == list(memory.STAGES)


def test_stages_shard_what_they_say():
    n, N = 1000, 4
    ddp = memory.per_rank_breakdown(n, N, "DDP", "fp32")
    z1 = memory.per_rank_breakdown(n, N, 1, "fp32")
    z2 = memory.per_rank_breakdown(n, N, "ZeRO-2", "fp32")
    z3 = memory.per_rank_breakdown(n, N, 3, "fp32")
    assert ddp == {"weights": 4000, "gradients": 4000, "optimizer states": 8000}
    assert z1 == {"weights": 4000, "gradients": 4000, "optimizer states": 2000}
    assert z2 == {"weights": 4000, "gradients": 1000, "optimizer states": 2000}
    assert z3 == {"weights": 1000, "gradients": 1000, "optimizer states": 2000}
    assert memory.per_rank_bytes(n, N, 3, "fp32") == 16 * n / N
    # one rank: every stage is DDP
    assert len(set(memory.per_rank_table(n, 1).values())) == 1


def test_max_params_inverts_per_rank_bytes():
    n = memory.max_params(80e9, 8, "ZeRO-3")
    assert memory.per_rank_bytes(n, 8, "ZeRO-3") == pytest.approx(80e9)
    assert memory.max_params(80e9, 1, "DDP") == pytest.approx(5e9)


@pytest.mark.parametrize("bad", [dict(stage=4), dict(stage="ZeRO-4"), dict(world_size=0), dict(precision_name="fp8")])
def test_rejects_bad_arguments(bad):
    kwargs = dict(n_params=10, world_size=2, stage=1, precision_name="mixed") | bad
    with pytest.raises(ValueError):
        memory.per_rank_bytes(**kwargs)


def test_measured_fp32_adam_is_4_4_8():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    n = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    before = memory.training_state_bytes(model, optimizer)
    assert before == {"parameters": 4 * n, "gradients": 0, "optimizer state": 0}
    model(torch.randn(5, 32)).sum().backward()
    optimizer.step()
    states = memory.optimizer_state_bytes(optimizer)
    assert states["exp_avg"] == states["exp_avg_sq"] == 4 * n
    assert states["step"] == 4 * 4  # one float32 scalar per parameter tensor
    assert memory.training_state_bytes(model, optimizer)["gradients"] == 4 * n


def test_tensor_bytes_counts_shared_storage_once():
    w = torch.zeros(10)
    assert memory.tensor_bytes([w, w, torch.zeros(3, dtype=torch.float64)]) == 40 + 24


def test_activation_bytes_grow_with_the_batch_and_exclude_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    small = memory.activation_bytes(model, torch.randn(8, 16))
    # saved: the input (8x16), the first output for ReLU (8x32), ReLU's output (8x32) for the last Linear
    assert small in {4 * 8 * (16 + 32 + 32), 4 * 8 * (16 + 32)}
    assert memory.activation_bytes(model, torch.randn(16, 16)) == 2 * small
