"""Join the process group the same way in every script, and leave it the same way.

    from dist_setup import setup, teardown

    device = setup()  # torchrun, mp.spawn, srun or plain python: the same call
    ...
    teardown()  # in the __main__ block, once main() has returned

Chapter 04 writes this module; every later script imports it, so keep it beside them.
"""

import gc
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

# Imported before the group exists, not after: torch.distributed.nn makes the default group
# the default value of its functions' group argument when it is first imported (torch.compile
# and DTensor import it late), and that value would keep the group, and gloo's threads, alive
# past teardown().
import torch.distributed.nn  # noqa: F401
from torch.distributed.device_mesh import DeviceMesh


def free_port() -> str:
    """A port the operating system says is free, for a launch by hand: never a fixed number."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def pick_device() -> torch.device:
    """cuda:LOCAL_RANK when every process on this node gets a GPU of its own, else the CPU."""
    # LOCAL_RANK, not RANK: on a second node of 8 GPUs, RANK starts at 8 and there is no cuda:8.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def setup(timeout_s: float = 30) -> torch.device:
    """Join the process group and return this process's device.

    The backend follows the device: nccl on a GPU, gloo on the CPU (dist.get_backend() says
    which). A collective that waits longer than timeout_s raises instead of hanging.
    """
    device = pick_device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    # On nccl, device_id binds the group to this process's GPU: the communicator is made now,
    # and barrier() knows which GPU to use.
    device_id = device if backend == "nccl" else None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's own store outlives a restart (--max-restarts) with the keys of the attempts
        # before it: each attempt writes under a prefix of its own.
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
        )
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"attempt_{attempt}", store)
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
        )
    elif "RANK" in os.environ:
        # Another launcher (mp.spawn, srun, a hand-written loop) set RANK, WORLD_SIZE,
        # MASTER_ADDR and MASTER_PORT: env:// reads them.
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    else:
        # Plain `python script.py`: a group of one, its store in memory, no port needed.
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    return device


def teardown() -> None:
    """Leave the group, in the __main__ block once main() has returned.

    A DDP or FSDP model keeps the group alive after destroy_process_group(); a gloo group still
    alive while Python shuts down can abort a process that finished its work ("terminate called
    without an active exception"). Collecting first frees what main() built on the group.
    """
    if dist.is_initialized():
        release_device_meshes()
        gc.collect()
        dist.destroy_process_group()


def release_device_meshes() -> None:
    """Make every DeviceMesh let go of its process groups.

    A mesh holds its groups, and DTensor keeps the meshes it has seen in caches that live as long
    as the process (redistribution plans, sharding rules), out of gc.collect()'s reach.
    """
    for obj in gc.get_objects():
        # The type, not isinstance(): DeviceMesh's isinstance check reads attributes of the object,
        # and one of torch's deprecated objects warns when read.
        if issubclass(type(obj), DeviceMesh):
            # The attribute that holds them (torch 2.13); older versions held names only.
            getattr(obj, "_pg_registry", {}).clear()
