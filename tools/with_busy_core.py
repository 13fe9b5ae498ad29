"""Run a command while one core is kept busy: is the test suite robust on a loaded machine?

    python tools/with_busy_core.py make test          # the whole suite beside a CPU hog
    python tools/with_busy_core.py --hogs 2 pytest tests/launches/test_launch.py

A CI runner or a student's laptop is rarely idle. The hog is a plain Python busy loop (one core
each); it starts before the command and is killed when the command ends, fails or is interrupted.
The command's exit code is returned.
"""

import argparse
import signal
import subprocess
import sys

BUSY_LOOP = "while True: pass"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=1, help="cores to keep busy (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    args = parser.parse_args()
    if not args.command:
        parser.error("give a command to run, e.g. make test")
    if args.hogs < 1:
        parser.error(f"--hogs must be at least 1, got {args.hogs}")
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.hogs)]
    print(
        f"with_busy_core: {args.hogs} busy core(s) (pids {', '.join(str(h.pid) for h in hogs)}) "
        f"while running: {' '.join(args.command)}",
        flush=True,
    )
    try:
        return subprocess.call(args.command)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    sys.exit(main())
