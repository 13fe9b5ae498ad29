"""The likely slips of each lab, recognised from what the student's code produced.

One module per lab task. Each function looks at results (numbers, tensors, orders) and returns a
sentence that names the slip they point to, or None; a lab's checker puts that sentence in its
FAIL line.
"""
