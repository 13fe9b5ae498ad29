"""Lab 11's checker names the slip injected into the solution: each variant's FAIL line says it.

All variants run in one launch on 2 processes (tests/slip_driver.py), for 2 steps instead of 6
(every slip shows in the first), the one-process reference trained once for them all. The last
variant runs the solution as on torch 2.12 (no all_gather_single nor reduce_scatter_single, the
version faked): the checker provides the older collectives, says so in a note, and passes.
"""

import pytest

from slip_injection import assert_fail_names, check_variants, lab_folder

SOLUTION = "lab11_zero3_by_hand.ipynb"
RELEASED = """            try:
                return forward(*inputs)
            finally:
                # Also when backward's recompute stops early, before the lines after forward.
                for name in self.names[index]:
                    setattr(layer, name, None)
"""
IMPORTS = "import torch.distributed as dist\n"
# slip -> (substitutions on the solution's lab11_zero3.py, the words its FAIL line must hold).
SLIPS = {
    "sum": (
        [("return out / world_size, None", "return out, None")],
        "every gradient is 2.00x the reference's: does backward return the sum instead of the average?",
    ),
    "no_recompute": (
        [
            (
                "return checkpoint(run, self.shards[index], *inputs, use_reentrant=False)",
                "return run(self.shards[index], *inputs)",
            )
        ],
        "got (20, 0, 20): no all-gather in backward: does the layer's forward go through checkpoint(...)?",
    ),
    "all_reduce": (
        [
            (
                "dist.reduce_scatter_single(out, padded)",
                "dist.all_reduce(padded)\n        out = padded.chunk(world_size)[dist.get_rank()].clone()",
            )
        ],
        "got (20, 20, 0): backward all-reduces the gradients instead of reduce-scattering them",
    ),
    "not_freed": (
        [
            (
                "                for name in self.names[index]:\n                    setattr(layer, name, None)\n",
                "                pass\n",
            )
        ],
        "is still set on its layer after forward: are the whole parameters set back to None",
    ),
    # Set back to None after forward, without finally: the recompute in backward stops before it.
    "no_finally": (
        [
            (
                RELEASED,
                "            out = forward(*inputs)\n            for name in self.names[index]:\n"
                "                setattr(layer, name, None)\n            return out\n",
            )
        ],
        "after backward: are the whole parameters set back to None in a finally:? In backward, non-reentrant "
        "checkpointing stops the recompute",
    ),
    "a_stub_left": (
        [
            (
                "        world_size = dist.get_world_size()\n        shard_numel",
                "        raise NotImplementedError()\n        world_size = dist.get_world_size()\n        shard_numel",
            )
        ],
        "FAIL ZeRO3 on 2 ranks: GatherShards.backward is not written yet (it raises NotImplementedError)",
    ),
    # The layer called, not its own forward: gathered -> run -> layer -> gathered ...
    "the_layer_called": (
        [("                return forward(*inputs)\n", "                return layer(*inputs)\n")],
        "FAIL ZeRO3 on 2 ranks: the forward recursed without end (RecursionError): does run() call layer(*inputs)?",
    ),
}
# Last: as on torch 2.12, for the rest of the launch.
OLDER_TORCH = [
    (
        IMPORTS,
        IMPORTS + "\n# As on torch 2.12: neither collective exists.\n"
        "del dist.all_gather_single, dist.reduce_scatter_single\n"
        'torch.__version__ = "2.12.1"\n',
    )
]
NOTE = (
    "note: torch 2.12.1 has no dist.all_gather_single or dist.reduce_scatter_single (new in torch 2.13): this check "
    "provides all_gather_into_tensor, reduce_scatter_tensor under those names"
)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab11"))
    slips = {name: substitutions for name, (substitutions, _) in SLIPS.items()} | {"torch_2_12": OLDER_TORCH}
    return check_variants(
        folder, "lab11_check.py", "lab11_zero3", slips, once=["reference_run"], constants={"STEPS": 2}
    )


@pytest.mark.parametrize("slip", SLIPS)
def test_the_fail_line_names_the_slip(checked, slip):
    assert_fail_names(checked[slip], SLIPS[slip][1])


def test_on_torch_2_12_the_checker_provides_the_collectives_with_a_note(checked):
    record = checked["torch_2_12"]
    assert record["code"] == 0 and record["error"] is None, record
    assert record["output"].startswith(NOTE + "\n"), record["output"]
    assert "FAIL" not in record["output"] and "PASS whole weights after 2 steps" in record["output"], record["output"]
