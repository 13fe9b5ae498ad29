"""nbgrader's configuration for the course's labs.

tools/grade.py copies it into the course folder (build/grading/ by default), where nbgrader's
commands and its formgrader read it.
"""

# nbgrader defines get_config() when it reads this file.
c = get_config()  # noqa: F821

c.CourseDirectory.course_id = "parallel-pytorch"
# A check cell bounds its own launches (torchrun(..., timeout=...), 120 s at most in the labs); the
# cell gets room beyond that, and a cell that still runs past it is interrupted and scores 0.
c.Execute.timeout = 150
# The kernel as make lab starts it: its messages encrypted where the kernel supports it.
c.KernelManager.transport_encryption = "auto"
