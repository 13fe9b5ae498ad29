"""Lab 08's checker names the slip injected into the solution: each variant's FAIL line says it.

All variants run in one launch on 2 processes (tests/slip_driver.py), for 3 steps instead of 5
(every slip shows by then, the halved learning rate included).
"""

import pytest

from slip_injection import assert_fail_names, check_variants, lab_folder

SOLUTION = "lab08_sharded_optimizer.ipynb"
OWNED = "if self.owner[p] == self.rank]"
BROADCAST = "dist.broadcast(p, src=self.owner[p])"
# slip -> (substitutions on the solution's lab08_sharded_optimizer.py, the words a FAIL line must hold).
SLIPS = {
    "round_robin": (
        [
            (
                "for p in sorted(params, key=lambda p: p.numel(), reverse=True):\n"
                "            rank = load.index(min(load))",
                "for i, p in enumerate(params):\n            rank = i % self.world_size",
            )
        ],
        "Adam: the largest share is at most 1/N of the state + the largest parameter's",
    ),
    "whole_model": (
        [(f'"params": [p for p in group["params"] {OWNED}', '"params": list(group["params"])')],
        "every parameter has state on exactly one rank: expected [0, 1, 2, 3, 4, 5, 6, 7], got [0, 0, 1, 1, 2, 2, "
        "3, 3, 4, 4, 5, 5, 6, 6, 7, 7]: every rank holds optimizer state for every parameter",
    ),
    "not_owned": (
        [(OWNED, OWNED.replace("==", "!="))],
        "weights after 3 steps vs unsharded Adam (all ranks): max |difference| = ",
    ),
    "no_broadcast": ([(BROADCAST, "pass")], "on each rank only the parameters it owns moved"),
    "broadcast_from_rank_0": (
        [(BROADCAST, "dist.broadcast(p, src=0)")],
        "the parameters owned by rank 1 never moved, on any rank",
    ),
    "learning_rate_lost": (
        [
            (
                "        for group, local_group in zip(self.param_groups, self.local.param_groups):\n"
                '            local_group.update({k: v for k, v in group.items() if k != "params"})\n',
                "",
            )
        ],
        "the weights are those of a run whose learning rate was never halved",
    ),
    # Sharding skipped: a whole optimizer, beside self.local, steps every parameter on every rank.
    "a_whole_optimizer_hidden": (
        [
            (
                "        self.local = optimizer_cls(local_groups, **kwargs)\n",
                "        self.local = optimizer_cls(local_groups, **kwargs)\n"
                '        self.whole = optimizer_cls([{**g, "params": list(g["params"])} for g in self.param_groups], '
                "**kwargs)\n",
            ),
            (
                "        self.local.step()\n        for group in self.param_groups:\n"
                '            for p in group["params"]:\n                ' + BROADCAST + "\n",
                "        self.whole.step()\n",
            ),
        ],
        "every parameter has state on exactly one rank: expected [0, 1, 2, 3, 4, 5, 6, 7], got [0, 0, 1, 1, 2, 2, "
        "3, 3, 4, 4, 5, 5, 6, 6, 7, 7]: every rank holds optimizer state for every parameter",
    ),
}
# Where the words above name the check and a number, the slip's own words follow.
ALSO = {"round_robin": "the owners go round-robin by position", "not_owned": "no parameter moved on any rank"}
# A second FAIL line the slip also gets: the state bytes measured.
SECOND = {
    "a_whole_optimizer_hidden": "Adam: the largest share is at most 1/N of the state + the largest parameter's: "
    "expected <= 296,596 bytes, got 331,040"
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab08"))
    slips = {name: substitutions for name, (substitutions, _) in SLIPS.items()}
    return check_variants(folder, "lab08_check.py", "lab08_sharded_optimizer", slips, constants={"STEPS": 3})


@pytest.mark.parametrize("slip", SLIPS)
def test_the_fail_line_names_the_slip(checked, slip):
    assert_fail_names(checked[slip], SLIPS[slip][1], ALSO.get(slip, ""))
    if slip in SECOND:
        assert_fail_names(checked[slip], SECOND[slip])
