"""Kernels that start on a busy machine: nbval's kernels talk to pytest over Unix sockets.

Over TCP, jupyter_client chooses a kernel's five ports in pytest's process (it binds each to port
0, reads the number and closes it), writes them into the connection file and starts the kernel,
which binds them only once it has imported IPython: seconds later on a loaded machine. Any
process that binds a port of the ephemeral range in between (a launch's store or gloo listener,
another kernel, another checkout's suite) can take one, and the kernel exits with "Address
already in use" before it answers: nbval then reports "Kernel died before replying to
kernel_info" (jupyter_client's LocalPortCache only keeps the ports of one process apart, as its
docstring says). Over Unix sockets (jupyter_client's transport "ipc") the kernel binds files in a
folder of this pytest process instead: there is no port to lose.

Every kernel nbval starts in this process gets its connection file, and its sockets beside it, in
a folder made for the run (short, because a socket's path may not exceed about 100 bytes), which
goes when the run ends. Where Unix sockets do not exist (Windows), nbval keeps TCP.
"""

import os
import shutil
import tempfile

import pytest

# A socket's path holds at most 107 bytes on Linux (103 on macOS); ours adds about 40 to the folder.
MAX_FOLDER_CHARS = 60
FOLDER = pytest.StashKey[str]()


def unix_socket_kernel_manager(base: type, folder: str) -> type:
    """``base`` (jupyter_client's KernelManager), with the ipc transport and its connection file,
    named afresh for each kernel, in ``folder``."""

    class UnixSocketKernelManager(base):
        def __init__(self, **kwargs):
            fd, connection_file = tempfile.mkstemp(prefix="kernel-", suffix=".json", dir=folder)
            os.close(fd)
            # The sockets are the connection file's name with "-ipc-1" to "-ipc-5" instead of ".json".
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("connection_file", connection_file)
            super().__init__(**kwargs)

    return UnixSocketKernelManager


def socket_folder() -> str:
    """A new folder for this run's kernel sockets, in the temporary folder if its path is short."""
    parent = tempfile.gettempdir()
    if len(parent) > MAX_FOLDER_CHARS - 20 and os.path.isdir("/tmp"):
        parent = "/tmp"
    return tempfile.mkdtemp(prefix="nbval-kernels-", dir=parent)


def pytest_configure(config):
    if os.name != "posix":
        return
    try:
        import nbval.kernel
    except ImportError:
        return
    folder = socket_folder()
    config.stash[FOLDER] = folder
    # nbval.kernel.start_new_kernel builds its manager from this module-level name.
    nbval.kernel.KernelManager = unix_socket_kernel_manager(nbval.kernel.KernelManager, folder)


def pytest_unconfigure(config):
    folder = config.stash.get(FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
