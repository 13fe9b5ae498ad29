"""The capstone trainer's parallel code, which ``scripts/train_gpt.py`` imports, one module per concern
(as torchtitan keeps ``parallelize.py`` and ``ParallelDims`` beside its ``train.py``):

- ``layouts``       the table of layouts: the processes each runs on, its device mesh, the functions
                    that apply it in order; the refusals, ``--help`` and the tests read it; the meshes,
                    made once per shape in a process group
- ``parallelize``   one function per parallelism (``apply_pp``, ``apply_tp``, ``apply_sp``,
                    ``apply_fsdp``, ``apply_cp``, ``apply_ddp``) and ``parallelize``, which applies a
                    layout's in order; a rank's share of each sequence, gradient sync over
                    micro-batches, the pipeline's schedule, the whole model gathered back
- ``experts``       expert parallelism: ``apply_ep``, the all-to-alls to the experts and back, the
                    gradients averaged by hand, a step's expert load
- ``checkpointing`` DCP checkpoints by parameter name that continue in any layout and world size,
                    in the background if asked; saving on a preemption signal
- ``step_metrics``  what a run measures: bytes per rank, activations kept for backward, one block's
                    collectives, when each step ends, the throughput
- ``precision``     --dtype (bfloat16 autocast), --float8 (torchao's FP8 linears, gathered in eight bits
                    by FSDP2) and --compile (every block) in the dense layouts, and what they did
- ``gradient_norm`` the whole model's gradient norm in any layout, every parameter counted once and
                    the same on every rank; clipping by it; the classic slips, for negative controls
"""
