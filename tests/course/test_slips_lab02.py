"""Lab 02's checks name the likely slips: each injected into the solution, in this process."""

import pytest

import lab_injection
from lab_injection import cell, first_failure, injected

LAB = "lab02_manual_data_parallel.ipynb"
# The setup, then each function with the check cell after it: c04/c05, c07/c08, c10/c11.
CELLS = ["c02", "c04", "c05", "c07", "c08", "c10", "c11"]
in_kernel = lab_injection.in_kernel

# slip -> (the cell it is in, its substitutions (old, new) of the solution's text, what the FAIL line names)
SLIPS = {
    # Step 1: every thread made in a loop by a lambda that sees the loop variable's last value.
    "late binding": (
        "c04",
        [
            (
                "threading.Thread(target=forward_and_backward, args=(i,))",
                "threading.Thread(target=lambda: forward_and_backward(i))",
            )
        ],
        "only the last slot (2) was written: did every thread run the last replica (a function made in a loop",
    ),
    "the model run instead of the replica": (
        "c04",
        [("replicas[i](chunks[i])", "model(chunks[i])")],
        "the replica has no gradient and the model has one: does the thread run the model, not its replica?",
    ),
    "backward after the join": (
        "c04",
        [
            ("        loss.backward()\n        losses[i] = loss.detach()", "        losses[i] = loss"),
            (
                "    return losses\n",
                "    for loss in losses:\n        loss.backward()\n    return [loss.detach() for loss in losses]\n",
            ),
        ],
        "does loss.backward() run after the threads are joined?",
    ),
    "every replica on the calling thread": (
        "c04",
        [
            (
                "    for t in threads:\n        t.start()\n    for t in threads:\n        t.join()",
                "    for i in range(len(chunks)):\n        forward_and_backward(i)",
            )
        ],
        "every replica ran on the calling thread",
    ),
    # Each thread joined before the next starts: threads, but one replica at a time.
    "one thread at a time": (
        "c04",
        [
            (
                "    for t in threads:\n        t.start()\n    for t in threads:\n        t.join()",
                "    for t in threads:\n        t.start()\n        t.join()",
            )
        ],
        "FAIL forwards that ran while the other replicas' ran too: expected 3, got 0: the replicas ran one at a "
        "time: does the function join each thread before it starts the next?",
    ),
    # Step 2: the loss of the whole batch.
    "the plain mean of the losses": (
        "c07",
        [
            (
                "return sum(loss * size for loss, size in zip(losses, sizes)) / sum(sizes)",
                "return sum(losses) / len(losses)",
            )
        ],
        "that is the plain mean of the chunks' losses",
    ),
    "the sum of the losses": (
        "c07",
        [("return sum(loss * size for loss, size in zip(losses, sizes)) / sum(sizes)", "return sum(losses)")],
        "that is the sum of the chunks' losses",
    ),
    "the loss not divided by the samples": (
        "c07",
        [(" / sum(sizes)", "")],
        "that is 100.00x the expected, the number of samples: a sum over the samples",
    ),
    "the loss divided by the chunks": (
        "c07",
        [(" / sum(sizes)", " / len(sizes)")],
        "that is 33.33x the expected, 100/3: divided by the number of chunks",
    ),
    # The answer skipped: the whole batch's loss computed again from the notebook's model and data.
    "the loss computed again": (
        "c07",
        [
            (
                "return sum(loss * size for loss, size in zip(losses, sizes)) / sum(sizes)",
                "return F.mse_loss(model(inputs), targets)",
            )
        ],
        "FAIL loss of 8 other samples in chunks of [1, 2, 5]: max |difference| = ",
    ),
    # Step 3: the gradient of the whole batch.
    "the sum of the gradients": (
        "c10",
        [("copy.grad * (size / total)", "copy.grad")],
        "that is the sum of the replicas' gradients",
    ),
    "the plain mean of the gradients": (
        "c10",
        [("copy.grad * (size / total)", "copy.grad / len(copies)")],
        "that is the plain mean of the replicas' gradients",
    ),
    "the gradients not divided by the samples": (
        "c10",
        [("copy.grad * (size / total)", "copy.grad * size")],
        "that is 100.00x the expected, the number of samples",
    ),
    ".grad set, not added to": (
        "c10",
        [("param.grad = grad if param.grad is None else param.grad + grad", "param.grad = grad")],
        "tolerance 2e-06: that is the gradient of one call: does the function set .grad where it should add to it?",
    ),
    # The answer skipped: the whole batch's gradient computed again from the notebook's data.
    "the gradient computed again": (
        "c10",
        [
            (
                "    total = sum(sizes)\n"
                "    for param, *copies in zip(model.parameters(), *(r.parameters() for r in replicas)):\n"
                "        grad = sum(copy.grad * (size / total) for copy, size in zip(copies, sizes))\n"
                "        param.grad = grad if param.grad is None else param.grad + grad\n",
                "    F.mse_loss(model(inputs), targets).backward()\n",
            )
        ],
        "FAIL gradient of 0.weight, 8 other samples in chunks of [1, 2, 5]: max |difference| = ",
    ),
}
# Where the words above name the check and a number, the slip's own words follow.
ALSO = {
    "the loss computed again": "that is the loss of the model on the whole batch, computed again",
    "the gradient computed again": "that is the gradient of the model on the whole batch, computed again",
}


@pytest.mark.usefixtures("in_kernel")
@pytest.mark.parametrize("slip", SLIPS)
def test_the_check_names_the_slip(slip):
    target, substitutions, named = SLIPS[slip]
    sources = [cell(LAB, c) for c in CELLS]
    for old, new in substitutions:
        sources[CELLS.index(target)] = injected(sources[CELLS.index(target)], old, new)
    failure = first_failure(sources)
    assert failure.startswith("FAIL "), failure
    assert named in failure and ALSO.get(slip, "") in failure, failure
