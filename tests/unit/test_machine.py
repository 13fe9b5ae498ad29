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


def facts(**changes):
    """A healthy CUDA 13 machine with two A100s, changed where a test says."""
    base = {
        "torch_version": "2.13.0",
        "cuda_build": "13.0",
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
        "driver": "580.65.06",
        "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "capability": "8.0", "compute_mode": "Default"}] * 2,
        "usable": True,
    }
    return machine.CudaFacts(**{**base, **changes})


def test_cuda_findings_of_a_healthy_gpu_machine():
    lines = machine.cuda_findings(facts())
    assert lines[0] == "2 NVIDIA GPU(s) (NVIDIA A100-SXM4-80GB), driver 580.65.06; torch 2.13.0 is built for CUDA 13.0"
    assert lines[1] == "CUDA is usable: the course uses nccl, one GPU per process"


def test_cuda_findings_without_a_gpu():
    (line,) = machine.cuda_findings(facts(gpus=[], driver=None, usable=False, cuda_build=None, arch_list=[]))
    assert "no NVIDIA GPU answers" in line and "CPU build" in line


def test_cuda_findings_name_a_cpu_build_on_a_gpu_machine():
    (line,) = machine.cuda_findings(facts(cuda_build=None, arch_list=[], usable=False))
    assert "is a CPU build: everything runs on the CPU" in line and "CUDA build" in line


def test_cuda_findings_name_a_driver_too_old_for_the_build():
    lines = machine.cuda_findings(facts(driver="550.54.15", usable=False))
    assert "present but UNUSABLE: CUDA 13 needs driver 580 or newer" in lines[1]
    assert "silently runs on the CPU" in lines[1] and "update the driver" in lines[1]


def test_cuda_findings_name_a_gpu_the_build_has_no_kernels_for():
    v100 = {"name": "Tesla V100-SXM2-32GB", "capability": "7.0", "compute_mode": "Default"}
    lines = machine.cuda_findings(facts(gpus=[v100]))
    assert "Tesla V100-SXM2-32GB (sm_70) is not among this build's architectures" in lines[1]
    assert "no kernel image is available" in lines[1]


def test_cuda_findings_name_exclusive_process_mode():
    gpu = {"name": "NVIDIA H100", "capability": "9.0", "compute_mode": "Exclusive_Process"}
    assert any("exclusive-process mode" in line for line in machine.cuda_findings(facts(gpus=[gpu])))


@pytest.mark.parametrize(
    "capability,arch_list,expected",
    [
        ("8.6", ["sm_80"], True),  # same major, older minor: the binary runs
        ("8.0", ["sm_86"], False),  # a newer minor does not
        ("9.0", ["sm_80", "compute_80"], True),  # PTX for an older GPU: the driver compiles it
        ("7.0", ["sm_75", "sm_80"], False),
        ("12.0", ["sm_120a"], True),
    ],
)
def test_has_kernels_for(capability, arch_list, expected):
    assert machine.has_kernels_for(capability, arch_list) is expected


def test_versions_and_describe_leave_cuda_uninitialised(monkeypatch):
    """A kernel that initialised CUDA can no longer fork a worker that uses it (chapters 03, 12)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: pytest.fail("CUDA initialised in this process"))
    # the names come from a child process, here a stand-in
    monkeypatch.setattr(machine, "cuda_devices", lambda: [{"name": "GPU", "capability": "9.0"}] * 2)
    machine.versions()
    assert machine.describe().gpus == ["GPU", "GPU"]


@pytest.mark.parametrize(
    "cuda,modes,expected",
    [
        (False, None, False),  # no CUDA: the kernel computes on the CPU
        (True, [["Default"], ["Default"]], True),
        (True, [["Default"], ["Exclusive_Process"]], False),  # one context per GPU: leave it to the jobs
        (True, None, True),  # nvidia-smi missing: nothing says the GPUs are exclusive
    ],
)
def test_the_kernel_uses_gpus_only_where_they_can_be_shared(monkeypatch, cuda, modes, expected):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(machine, "nvidia_smi", lambda *fields: modes)
    assert machine.kernel_may_use_gpus() is expected


def test_core_share_is_the_part_of_the_time_a_busy_loop_had_a_core():
    """Shared with another thread of this process that never lets go (Python's lock changes hands
    every few milliseconds), the loop has its core for about half the time at best, loaded machine
    or not: the measure is not fooled into calling that quiet."""
    import threading

    from parallel_course.machine import core_share

    assert 0 < core_share(0.02) <= 1
    stop = threading.Event()

    def hold_the_lock():
        while not stop.is_set():
            pass

    rival = threading.Thread(target=hold_the_lock)
    rival.start()
    try:
        shared = core_share(0.2)
    finally:
        stop.set()
        rival.join()
    assert shared < 0.8, shared
