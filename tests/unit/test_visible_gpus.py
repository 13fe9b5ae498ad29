"""GPUs for emulated nodes come from the list this process inherited, never by absolute index."""

import pytest

from parallel_course import visible_gpus
from parallel_course.visible_gpus import split_gpus, visible_entries


def test_an_unset_variable_means_every_gpu_of_the_machine():
    assert visible_entries(None, 4) == ["0", "1", "2", "3"]
    assert split_gpus(2, 1, None, 2) == ["0", "1"]
    assert split_gpus(2, 2, None, 4) == ["0,1", "2,3"]


def test_an_inherited_list_is_split_not_replaced():
    # A SLURM job without device cgroups on GPUs 4-7: indices 0-3 are someone else's.
    assert split_gpus(2, 2, "4,5,6,7", 4) == ["4,5", "6,7"]
    assert split_gpus(2, 1, "6, 3", 2) == ["6", "3"]
    # More GPUs than the nodes need: the first ones, in the inherited order.
    assert split_gpus(2, 1, "7,2,5", 3) == ["7", "2"]


def test_uuid_and_mig_lists_are_kept_as_given():
    uuids = "GPU-8f6e2c1a-aaaa-bbbb-cccc-000000000001,GPU-8f6e2c1a-aaaa-bbbb-cccc-000000000002"
    assert split_gpus(2, 1, uuids, 2) == uuids.split(",")
    mig = "MIG-1d2e3f40-0000-1111-2222-333333333333,MIG-1d2e3f40-0000-1111-2222-444444444444"
    assert split_gpus(2, 1, mig, 2) == mig.split(",")


def test_too_few_gpus_give_every_node_none():
    assert split_gpus(2, 1, "", 0) == ["", ""]  # set and empty: no GPU visible
    assert split_gpus(2, 1, None, 0) == ["", ""]  # a machine without GPUs
    assert split_gpus(2, 2, "0,1,2", 3) == ["", ""]  # three GPUs for two nodes of two
    assert split_gpus(2, 1, "3", 1) == ["", ""]


def test_only_the_entries_cuda_counts_are_gpus():
    # CUDA stops at the first invalid entry: "3,bad,5" shows one GPU, and 5 is not among them.
    assert visible_entries("3,bad,5", 1) == ["3"]
    assert split_gpus(2, 1, "3,bad,5", 1) == ["", ""]


@pytest.mark.parametrize("inherited", [None, "", "2,3", "GPU-aaaa,GPU-bbbb"])
def test_this_process_reads_its_environment_and_torch(monkeypatch, inherited):
    import torch

    if inherited is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", inherited)
    count = 0 if not inherited else len(inherited.split(","))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    expected = {None: ["", ""], "": ["", ""], "2,3": ["2", "3"], "GPU-aaaa,GPU-bbbb": ["GPU-aaaa", "GPU-bbbb"]}
    assert visible_gpus.emulated_node_gpus(2, 1) == expected[inherited]
