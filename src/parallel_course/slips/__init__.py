"""The likely slips of each lab, recognised from what the student's code produced.

One module per lab task. Each function looks at results (numbers, tensors, orders, collectives
counted) and returns a sentence that names the slip they point to, or None; a lab's checker puts
that sentence in its FAIL line. ``simulated_group`` is shared: a process group simulated on
threads, in which labs 03 and 13 run a ring first (a deadlock found at once, messages counted) and
lab 15 its norm on 12 ranks (collectives on subgroups). ``norm_layout`` is lab 15's model and layout
(who holds which piece of which gradient), beside its checks in ``global_norm``.
"""
