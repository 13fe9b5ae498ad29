"""Join a group of one as every course script does, use a DeviceMesh and DTensor (whose caches keep
the mesh), then leave, and print which of gloo's threads are still running (Linux names them).

    python leave_group.py teardown     # dist_setup.teardown(): none should be left
    python leave_group.py old-ending   # gc.collect() and destroy_process_group() only
    python leave_group.py late-import  # torch.distributed.nn imported after the group exists
"""

import gc
import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

from dist_setup import setup, teardown  # noqa: E402


def gloo_threads() -> list[str]:
    names = (Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task"))
    return sorted(name for name in names if "gloo" in name)


def main(mode: str) -> None:
    if mode == "late-import":
        # Undo dist_setup's early import, so that the module is imported again once the group exists.
        for name in [name for name in sys.modules if name.startswith("torch.distributed.nn")]:
            del sys.modules[name]
    setup()
    print("while in the group:", gloo_threads())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)]).full_tensor()
    if mode == "late-import":
        importlib.import_module("torch.distributed.nn")


if __name__ == "__main__":
    mode = sys.argv[1]
    main(mode)
    if mode == "old-ending":
        gc.collect()
        dist.destroy_process_group()
    else:
        teardown()
    print("after leaving:", gloo_threads())
