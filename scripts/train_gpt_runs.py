"""Several trainings of train_gpt.py in one launch: one process group, one start-up.

    torchrun --standalone --nproc_per_node=2 train_gpt_runs.py \\
        "--parallel ddp --steps 8 --out work/gpt_ddp" "--parallel fsdp --steps 8 --out work/gpt_fsdp"

Each argument is one command line of train_gpt.py (which must sit beside this file, with
dist_setup.py), run in turn as train_gpt.py runs it alone: the same checks, the same lines, the
same metrics.json and final.pt, bit for bit. What the trainings share is what a launch costs before
the first step: starting Python and torch in every process, joining the group, the first DDP's
import of torch._dynamo; and a device mesh, made by the first training of its shape and reused by
the next (parallel_course.training.layouts). Each command line is checked just before its
training, since a --resume may name a checkpoint an earlier training writes; a bad one stops the
launch in one line. Under plain python, the trainings of one process.
"""

import gc
import shlex
import sys

import train_gpt
from dist_setup import setup, teardown


def main(argv=None) -> int:
    commands = sys.argv[1:] if argv is None else argv
    if not commands:
        sys.stderr.write('usage: train_gpt_runs.py "TRAIN_GPT ARGUMENTS" ["TRAIN_GPT ARGUMENTS" ...]\n')
        return 2
    words = [shlex.split(command) for command in commands]
    # The first is checked before the group is joined: a wrong process count is one line, before anything starts.
    args = train_gpt.parse_args(words[0])
    device = setup()
    for i, argv in enumerate(words):
        if i > 0:
            try:
                args = train_gpt.parse_args(argv)
            except SystemExit as refused:
                # argparse has said why, in one line; every rank stops alike.
                return refused.code
        if train_gpt.dist.get_rank() == 0:
            sys.stdout.write(f"[{i + 1}/{len(words)}] train_gpt.py {' '.join(argv)}\n")
        code = train_gpt.run(args, device)
        # What the training built on the group (DDP, FSDP, the model) is freed before the next one.
        gc.collect()
        if code:
            return code
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
