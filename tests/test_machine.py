import pytest

from parallel_course import machine


def test_backend_is_nccl_only_with_a_gpu_per_process():
    both = {"gloo": True, "nccl": True, "mpi": False}
    assert machine.pick_backend(num_gpus=4, backends=both, world_size=4) == "nccl"
    assert machine.pick_backend(num_gpus=1, backends=both, world_size=2) == "gloo"
    assert machine.pick_backend(num_gpus=0, backends=both, world_size=1) == "gloo"


def test_backend_needs_something_available():
    with pytest.raises(RuntimeError, match="neither nccl"):
        machine.pick_backend(0, {"gloo": False, "nccl": False}, 2)


def test_world_size_below_one_is_rejected():
    with pytest.raises(ValueError, match="world size must be at least 1, got 0"):
        machine.pick_backend(0, {"gloo": True}, 0)


@pytest.mark.parametrize("gpus,cores,expected", [(0, 1, 2), (0, 2, 2), (0, 3, 3), (0, 64, 4), (1, 8, 1), (8, 2, 8)])
def test_recommended_world_size(gpus, cores, expected):
    assert machine.recommended_world_size(gpus, cores) == expected


def test_recommended_world_size_rejects_nonsense():
    with pytest.raises(ValueError):
        machine.recommended_world_size(-1, 2)


def test_implications_explain_a_cpu_only_machine():
    m = machine.Machine("3.11", "2.13.0", None, 2, 2, [], {"gloo": True, "nccl": False, "mpi": False})
    text = "\n".join(machine.implications(m))
    assert "No GPU (a CPU build of torch)" in text
    assert "nccl is not available" in text
    assert "Suggested world size on this machine: 2." in text


def test_implications_of_one_gpu_mention_gloo_for_extra_ranks():
    m = machine.Machine("3.11", "2.13.0", "12.8", 8, 4, ["H100"], {"gloo": True, "nccl": True, "mpi": False})
    assert any("nccl needs one GPU per process" in line for line in machine.implications(m))


def test_describe_reports_this_machine():
    m = machine.describe()
    assert m.logical_cores >= 1 and m.backends["gloo"]


def test_placement_puts_ranks_on_their_local_gpu_or_all_on_the_cpu():
    assert machine.placement(2, 2) == ["rank 0: cuda:0 (nccl)", "rank 1: cuda:1 (nccl)"]
    assert machine.placement(1, 2) == ["rank 0: cpu (gloo)", "rank 1: cpu (gloo)"]


def test_placement_rejects_negative_gpus():
    with pytest.raises(ValueError, match="number of GPUs must be >= 0"):
        machine.placement(-1, 2)


def test_versions_name_the_environment_without_an_absolute_path(capsys):
    machine.versions()
    out = capsys.readouterr().out
    assert "the course's .venv" in out or "environment" in out
    assert "/" not in out.splitlines()[0], "the interpreter's path would carry the author's folders"
    assert "torch threads in this kernel:" in out


def test_environment_name_tells_the_course_venv_from_others(tmp_path):
    assert machine.environment_name(str(tmp_path)) != "the course's .venv"
