"""parallel_course.fake_cluster: a GPT sharded over a fake (dp, tp) mesh in one process, by the
apply functions train_gpt.py applies (parallel_course.training.parallelize). What each rank stores
is counted by hand; the fake group is gone afterwards, also after an error, so that a notebook
kernel can build another."""

import pytest
import torch.distributed as dist

from parallel_course import fake_cluster as fc
from parallel_course import transformer_memory as tm
from parallel_course.gpt import GPT, GPTConfig

# The course's GPT, wide enough to split over 8 ranks.
SMALL = GPTConfig(vocab_size=16, block_size=16, d_model=64, n_layers=2, n_heads=8)


def by_hand(cfg: GPTConfig, dp: int, tp: int) -> int:
    """Elements one rank stores: the weights apply_tp splits (and the column-parallel biases) over
    dp x tp, the rest (embeddings, norms, row-parallel biases) over dp only."""
    model = GPT(cfg)
    split = {"weight", "bias"}
    tp_split = [
        f"blocks.{i}.{m}.{w}"
        for i in range(cfg.n_layers)
        for m in ("attn.q", "attn.k", "attn.v", "mlp.fc")
        for w in split
    ]
    tp_split += [f"blocks.{i}.{m}.weight" for i in range(cfg.n_layers) for m in ("attn.proj", "mlp.proj")]
    tp_split += ["head.weight"]
    return sum(p.numel() // (dp * tp if n in tp_split else dp) for n, p in model.named_parameters())


def test_what_a_rank_stores_on_a_2_x_4_mesh():
    sharded = fc.shard_on_fake_mesh(SMALL, dp=2, tp=4, rank=5, sequence_parallel=False)
    assert (sharded.world_size, sharded.dp, sharded.tp, sharded.rank) == (8, 2, 4, 5)
    assert sharded.total_parameters == sum(p.numel() for p in GPT(SMALL).parameters())
    assert sharded.local_parameters == by_hand(SMALL, 2, 4)
    assert sharded.local_bytes == 4 * sharded.local_parameters
    q = sharded.parameter("blocks.0.attn.q.weight")
    # Column-parallel: output features over tp (64 / 4), then FSDP's rows of that shard over dp.
    assert (q.shape, q.local_shape) == ((64, 64), (8, 64))
    assert q.placements == "(_StridedShard(dim=0, sf=4), Shard(dim=0))"
    proj = sharded.parameter("blocks.0.attn.proj.weight")
    assert proj.local_shape == (32, 16) and proj.placements == "(Shard(dim=0), Shard(dim=1))"
    # Not split by tp: sharded by FSDP over dp alone, on its 1-D mesh.
    assert sharded.parameter("tok_emb.weight").placements == "(Shard(dim=0),)"
    assert not dist.is_initialized()


def test_fsdp_alone_stores_one_share_of_what_the_formula_counts_plus_the_positions():
    sharded = fc.shard_on_fake_mesh(SMALL, dp=4, tp=1)
    shape = tm.Shape(SMALL.n_layers, SMALL.d_model, SMALL.n_heads, SMALL.vocab_size)
    # transformer_memory leaves the learned position embedding out.
    positions = SMALL.block_size * SMALL.d_model
    assert sharded.local_parameters == tm.parameters_per_rank(shape, "fsdp", 4, 1) + positions / 4


def test_seven_billion_on_64_ranks():
    sharded = fc.shard_on_fake_mesh(fc.SEVEN_B, dp=8, tp=8)
    assert sharded.total_parameters == 6_723_084_288
    # 4096 x 16384 column-parallel over 8, its rows over 8 more; the embeddings too, with sequence
    # parallelism (32,000 tokens over 64).
    assert sharded.parameter("blocks.0.mlp.fc.weight").local_shape == (16384 // 64, 4096)
    assert sharded.parameter("tok_emb.weight").local_shape == (500, 4096)
    # What transformer_memory counts for 2d (tensor and sequence parallel, then FSDP), plus what it
    # leaves out or splits further: the position embedding, and the norms and row-parallel biases,
    # which tp keeps whole (6 vectors of 4096 a block, 2 in the final norm), split over dp only.
    shape = tm.Shape(32, 4096, 32, 32000)
    extra = 4096 * 4096 / 64 + (32 * 6 + 2) * 4096 * (1 / 8 - 1 / 64)
    assert sharded.local_parameters == tm.parameters_per_rank(shape, "2d", 64, 8) + extra


def test_the_group_is_destroyed_after_an_error():
    with pytest.raises(RuntimeError, match="inside"):
        with fc.fake_world(16, rank=3):
            assert dist.get_world_size() == 16 and dist.get_rank() == 3
            raise RuntimeError("inside")
    assert not dist.is_initialized()


def test_refusals():
    with pytest.raises(ValueError, match="must divide the 8 heads"):
        fc.shard_on_fake_mesh(SMALL, dp=1, tp=3)
    with pytest.raises(ValueError, match="rank 4 is not one of 4"):
        with fc.fake_world(4, rank=4):
            pass
    with fc.fake_world(2):
        with pytest.raises(RuntimeError, match="exists in this process already"):
            with fc.fake_world(2):
                pass
    assert not dist.is_initialized()
