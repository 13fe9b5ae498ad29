"""The timing report: at the end of a run, the time of every test file and notebook, slowest last,
then all notebooks together and everything (the session's process counts its workers' tests too)."""

from collections import defaultdict


class TimePerFile:
    """Adds up the time of each test's setup, call and teardown by its file or notebook."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_terminal_summary(self, terminalreporter):
        if not self.seconds:
            return
        tr = terminalreporter
        tr.section("time per test file and notebook (slowest last)")
        for path, seconds in sorted(self.seconds.items(), key=lambda kv: kv[1]):
            tr.write_line(f"{seconds:7.1f} s  {path}")
        notebooks = sum(s for p, s in self.seconds.items() if p.endswith(".ipynb"))
        tr.write_line(f"{notebooks:7.1f} s  all notebooks")
        tr.write_line(f"{sum(self.seconds.values()):7.1f} s  everything")


def pytest_configure(config):
    config.pluginmanager.register(TimePerFile(), "time-per-file")
