"""The suite's own pytest plugins, one concern each, loaded by the root conftest.py.

- ``nothing_left_behind``: the run's mark and its owner, stopping on a signal, the aftermath;
- ``units_of_work``: what one pytest-xdist worker runs whole, and the order work is handed out in;
- ``timing``: the time of every test file and notebook, printed at the end.

The tests of the harness itself sit beside them (``test_*.py``).
"""
