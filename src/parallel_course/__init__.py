"""Helpers for the Parallel PyTorch course.

Small modules, each doing what its name says:

- ``launch``         set a notebook up for ``!torchrun``; bounded launches for check cells;
                     torchrun's failure report, rank by rank (09)
- ``machine``        what this machine offers: cores, GPUs, backends, where each rank runs (00)
- ``costmodel``      predicted step time and speedup of data-parallel training (01)
- ``data_parallel``  DataParallel's steps re-enacted on threads (02)
- ``collectives``    ring and naive all-reduce simulated step by step, bytes counted (03)
- ``bandwidth``      algorithm and bus bandwidth, the alpha-beta fit, the slowest rank's median (06a)
- ``scaling``        speedup, efficiency, overlap; the rows of a scaling benchmark (06b)
- ``resource_use``   threads that computed; bytes saved for backward (06a, 06c)
- ``profiler_traces`` steps, computation and all-reduces read from a profiler trace (06c)
- ``bench_plots``    the plots of the benchmarks (06a, 06b)
- ``model_parallel`` pipeline schedules as data (GPipe, 1F1B, interleaved 1F1B, ZB-H1), bubble, stage splitting (07a)
- ``schedule_checks`` a pipeline schedule's properties checked, each slip named (lab 07a)
- ``memory``         bytes per parameter; ZeRO-1/2/3 memory per rank (08)
- ``gpt``            a small GPT and an addition task made by the course, its mixture of experts (11, 12, 13b)
- ``training``       the capstone trainer's parallel code (scripts/train_gpt.py imports it; see its
                     ``__init__``): the table of layouts, one function per parallelism, expert
                     parallelism, checkpoints, step metrics, the whole gradient's norm (11, 11c, 13a,
                     13b, 15)
- ``input_pipeline`` data sets and timers for feeding a training step (11b)
- ``transformer_memory`` memory per rank of a GPT by layout, from formulas (11)
- ``context_parallel`` a sequence split over ranks: block attention merged by log-sum-exp, ring and
                     Ulysses attention, zig-zag positions, the all-to-all (13a, 13b); ring-flash (16)
- ``runs``           what a training run leaves in its ``--out`` folder (04, 09, 11); plots of it; two
                     runs trained alike: losses and gradient norms (11, 11c, 13a, 13b, 14c, 15)
- ``gradient_scale`` the figures of the gradient's scale: norms per step, gaps from a reference (15)
- ``planner``        memory, step time, tokens/s and MFU of a layout; feasible layouts ranked (14a)
- ``published_runs`` trainings that ran (BLOOM, MT-NLG, Llama 3) with their sources, to test the planner (14a)
- ``throughput``     the matmul peak measured as 06a does; a run's step times, tokens/s, model FLOP/s and MFU (14a)
- ``fake_cluster``   a GPT of a real size sharded over a fake (dp, tp) mesh of hundreds of ranks in one process (14a)
- ``debugging``      flight records read (who is behind, the first mismatch), every rank's stack, stragglers (14b)
- ``communication``  bytes of DDP's hooks, HSDP and local SGD, counted; bytes across nodes; DiLoCo (14c)
- ``float8``         FP8 formats, scales and casts counted; the recipe by hand; torchao's conversion; FSDP2's
                     all-gather bytes (17a)
- ``compiled``       torch.compile per block under sharding; graphs, breaks, recompiles and the collectives
                     of compiled code counted; compiled autograd (17b)
- ``flash_attention`` FlashAttention by hand: tiles, the online softmax, a backward that recomputes;
                     bytes saved for backward counted (16)
- ``loss_memory``    the cross-entropy over chunks recomputed in backward; the vocabulary-parallel loss by hand (16)
- ``memory_tracking`` torch's memory trackers on the capstone's layouts, every byte set beside the
                     accounting; selective checkpointing's policy; offload hooks (16)
- ``memory_figures`` chapter 16's figures: FlashAttention's tiles, bytes saved against the sequence,
                     the tracked peaks by layout
- ``figure_output`` a figure shown as a PNG with its text alternative (the decks and the site use it)
- ``machine_figures`` chapter 00's figures: this machine and where the launch test ran; its all-reduce
- ``collective_figures`` chapter 03's figures: each collective before and after; the ring step by step
- ``sharding_figures`` chapter 08's figures: what each rank keeps under DDP and ZeRO-1/2/3; FSDP2's step
- ``launcher_figures`` chapter 12's figures: what each process of each launch did; their losses
- ``fault_tolerance_figures`` chapter 09's figures: a job's attempts through a crash, checkpoint and
                     restart (the timeline 11c reuses); each rank's part in a crash and a hang
- ``capstone_figures`` chapter 11c's figures: micro-batches with their answer tokens and each token's
                     weight; jobs that continue in another layout; a checkpoint resharded
- ``parallelism_figures`` chapter 01's figures: data vs model parallelism (what each worker holds,
                     what crosses); the bytes on each link, parameter server vs ring
- ``data_parallel_figures`` chapter 02's figure: one DataParallel step (scatter, replicate, apply,
                     gather, the replicas' gradients summed)
- ``ddp_figures``    chapters 04 and 05's figures: DistributedSampler's reads per epoch with and without
                     set_epoch; DDP's buckets in backward order and their all-reduce timeline
- ``performance_figures`` chapters 06b and 06c's figures: where a rank's DDP step goes; what autograd
                     keeps for backward(); M17's norms
- ``tensor_parallel_figures`` chapter 07b's figure: a linear layer split by rows and by columns, what
                     each rank computes, the collectives counted
- ``cluster_figures`` chapter 10's figures: two nodes' ranks and the rendezvous; the GPU by LOCAL_RANK
                     and by RANK; an elastic join
- ``input_pipeline_figures`` chapter 11b's figures: the samples each rank and loader worker read,
                     with their noise; each step's wait and compute on a timeline
- ``long_sequence_figures`` chapter 13a's figures: ring attention run on simulated ranks, each
                     rank's K/V block and each block pair's mask per step, contiguous and zig-zag
- ``expert_figures`` chapter 13b's figures: each expert's slots as the router filled them
                     (capacity, drops); what ep's two all-to-alls carry
- ``debugging_figures`` chapter 14b's figures: every rank's flight record by sequence number, where
                     ranks fall behind or disagree
- ``compat``         what differs between torch 2.11-2.13, one helper per fact: versions and one-line
                     notes or refusals, DDP's buffer-sync keyword, the single-tensor collectives' names,
                     a group's timeout
- ``visible_gpus``   GPUs of their own for emulated nodes, from the list this process inherited (04, 10)
- ``checks``         clear verdicts for lab check cells
- ``slips``          each lab's likely slips recognised in a result, for the checks' verdicts (one module per lab task)
- ``scriptdiff``     what a notebook's %%writefile cells write; a step's change as a diff (04, 09)
- ``excerpts``       the functions of a long script that a lecture shows, found by name; scripts copied to work/
- ``explorers``      ipywidgets explorers over the functions above, one pattern (``explorers.base``),
                     one module each: placement (00), cost_model (01), ring (03), pipeline (07a),
                     zero (08), layout_memory (11), planner (14a)
"""

from .launch import setup_notebook

__all__ = ["setup_notebook"]
__version__ = "0.1.0"
