"""What must stand at the root of the repository: the import paths, and the suite's plugins.

The plugins live in tests/harness/, one concern each (tests/README.md): nothing_left_behind (the
run's mark, stopping on a signal, the aftermath), units_of_work (what one pytest-xdist worker
runs whole, and the order work is handed out in), timing (the time of each file, at the end),
unix_socket_kernels (nbval's kernels over Unix sockets, which no other process can take) and
leftovers (an earlier run's files in work/, planted before a notebook's run and checked after it).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The authoring tools (labs from solutions, script export) live in tools/, outside the package
# students import; the tests that check them import them from there.
sys.path.insert(0, str(ROOT / "tools"))
# What several test folders share (helpers, browser, the harness) sits in tests/.
sys.path.insert(0, str(ROOT / "tests"))

# Only the root conftest.py may load plugins this way.
pytest_plugins = [
    "harness.nothing_left_behind",
    "harness.units_of_work",
    "harness.timing",
    "harness.unix_socket_kernels",
    "harness.leftovers",
]
