"""Lines of lab 15's solution (its lab15_norm.py) that the slip tests replace, and the edits that
both inject: in the kernel (tests/course/test_slips_lab15_checks.py) and launched
(tests/launches/test_slips_lab15.py). One place, so that the two inject the same slip."""

TP = '    dist.all_reduce(squares["tp_split"], group=layout.tp.group)\n'
DP = '    dist.all_reduce(squares["expert"], group=layout.dp.group)\n'
PP = "    dist.all_reduce(stage, group=layout.pp.group)\n"
SKIP = "    if not torch.isfinite(norm):\n        return False\n"
OWN_TEST = "    if not all(torch.isfinite(p.grad).all() for p in pieces):\n        return False\n"
# The point skipped: each tp rank gathers the whole tensors and takes their norm (the right number,
# with far more bytes than sums of squares).
GRADIENTS_GATHERED = [
    (
        "        squares[piece.kind] += piece.grad.pow(2).sum()\n",
        "        grad = piece.grad\n"
        '        if piece.kind == "tp_split":\n'
        "            parts = [torch.empty_like(grad) for _ in range(layout.tp.size)]\n"
        "            dist.all_gather(parts, grad, group=layout.tp.group)\n"
        "            grad = torch.cat(parts)\n"
        "        squares[piece.kind] += grad.pow(2).sum()\n",
    ),
    (TP, ""),
]
