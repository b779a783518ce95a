"""A lying service, fuzzed (tests/e2e/fuzz_kit.py): seeded scenarios of lies told by a proxy in
front of the real ``glasu serve`` to a real ``glasu worker``, and the owner's guarantee checked
from what crossed the wire and the owner's ledger file (docs/protocol.md, "How the owner's
guarantee is tested: the fuzzer").

By default a handful of scenarios run (under a minute); the slow suite runs seeds 0 to
``GLASU_FUZZ_SCENARIOS`` - 1 (default 24, about 8 minutes on 2 cores) and the regression list;
``PYTHONPATH=. python tests/e2e/fuzz_kit.py --scenarios N`` runs any number outside pytest."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fuzz_kit import (
    DELTA,
    Capture,
    FuzzService,
    Lie,
    Outcome,
    Scenario,
    Told,
    Upload,
    check,
    fuzz_service,
    independent_epsilon,
    scenario_for,
)

from clients.owner_ledger import OwnerLedger

pytestmark = pytest.mark.e2e

# Seeds whose scenario found "two noise levels, one noise draw, one ledger row" (issue 35) on
# the code before a release's identity covered its mechanism's parameters (every one of seeds
# 0-23 that broke an invariant): an old session replayed at z x 1.5 or 2 (0, 4, 15, 18, 23;
# under CKKS 19), or at z x 1 with the restarted run told z x 2 or 4 (11, 21); one session
# whose restarted worker, rewound to pass 0, is told z x 0.9 (5) or z x 1.8 (20). A regression
# list: the slow suite runs them all, the default run the cheapest (20, 12-18 s on 2 cores).
KNOWN_HOLE_SEEDS = [0, 4, 5, 11, 15, 18, 19, 20, 21, 23]
DEFAULT_SEEDS = [20]
SLOW_SCENARIOS = int(os.environ.get("GLASU_FUZZ_SCENARIOS", "24"))


@pytest.fixture(scope="module")
def fuzzing(cora, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzService]:
    """One real service and one lying proxy for every scenario of the module."""
    with fuzz_service(cora, tmp_path_factory.mktemp("fuzz")) as service:
        yield service


def play(service: FuzzService, seed: int) -> None:
    scenario = scenario_for(seed)
    outcome = service.run(scenario)
    findings = check(outcome)
    print(scenario.describe())
    print(f"  -> victim exits {outcome.exit_codes}, {len(outcome.capture.uploads)} uploads,"
          f" {outcome.seconds:.1f} s")  # fmt: skip
    assert not findings, "\n".join(
        [scenario.describe(), *map(str, findings), outcome.log_tail[-3000:]]
    )


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_a_fuzzed_lying_service(fuzzing: FuzzService, seed: int) -> None:
    play(fuzzing, seed)


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed", sorted((set(range(SLOW_SCENARIOS)) | set(KNOWN_HOLE_SEEDS)) - set(DEFAULT_SEEDS))
)
def test_many_fuzzed_lying_services(fuzzing: FuzzService, seed: int) -> None:
    play(fuzzing, seed)


# Answers the worker once died on with a traceback (found by seeds 6, 9 and 22): each must be
# refused as a protocol violation (exit 1, one sentence), before anything more is released.
MALFORMED = {
    "a sum cut short": (Lie("aggregate", None, 0, "body", "truncate"), "expected"),
    "a field no model has": (Lie("session", None, None, "unknown_field", "privacy"), "surprise"),
    "a part size of zero": (Lie("session", None, None, "part_values", 0), "part_values"),
    "a pass with no output nodes": (
        Lie("pass", None, 0, "output_nodes", "empty"),
        "pass 0 has no output nodes",
    ),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_answer_is_refused_as_a_protocol_violation(
    fuzzing: FuzzService, name: str
) -> None:
    lie, said = MALFORMED[name]
    scenario = Scenario(
        seed=900_001, encryption="none", rounds=1, hidden=8, restarts=0, checkpoint="none",
        accept_conflicts=False, alias_z_factor=None, lies=(lie,),
    )  # fmt: skip
    outcome = fuzzing.run(scenario)
    assert outcome.exit_codes == [1], outcome.log_tail[-3000:]
    assert "Traceback" not in outcome.log_tail, outcome.log_tail[-3000:]
    assert "breaks the protocol" in outcome.log_tail and said in outcome.log_tail
    assert check(outcome) == []


# -- the checks themselves, on a made-up capture (no processes) ------------------------------


def made_up_outcome(tmp_path: Path, *, same_draw: bool, rows_recorded: int) -> Outcome:
    """Two uploads of one pass at z and 2z: with one noise draw (the hole) or two; and a
    ledger with ``rows_recorded`` rows of it."""
    rng = np.random.default_rng(0)
    nodes = np.arange(40)
    clean = rng.normal(0, 0.2, size=(40, 8))
    clip, cap, z = 1.0, 2, 1.2
    sigma = z * 2 * clip * np.sqrt(cap + 1)
    first_draw = rng.normal(size=clean.shape)
    second_draw = first_draw if same_draw else rng.normal(size=clean.shape)
    bodies = [clean + sigma * first_draw, clean + 2 * sigma * second_draw]
    capture = Capture()
    for factor in (1, 2):
        privacy = {"noise_multiplier": z * factor, "clip": clip, "occurrence_cap": cap}
        capture.told.append(Told(factor - 1, "new", "s", privacy, 2))
    for attempt, body in enumerate(bodies):
        capture.uploads.append(
            Upload(attempt, "new", "s", 0, 1, 0, 40, 8, "float32",
                   body.astype("<f4").tobytes(), nodes)
        )  # fmt: skip
    path = tmp_path / "ledger.sqlite3"
    with OwnerLedger(path) as ledger:
        for i in range(rows_recorded):
            ledger.record(session_id="s", pass_index=0, noise_multiplier=z * (i + 1), layer=1,
                          release_digest=f"d{i}")  # fmt: skip
    return Outcome(Scenario.draw(0), capture, [0], path, ["s"], "", 0.0)


def test_the_checks_find_one_noise_draw_counted_once(tmp_path: Path) -> None:
    findings = check(made_up_outcome(tmp_path, same_draw=True, rows_recorded=1))
    assert {f.invariant for f in findings} == {"a", "b", "c"}, findings


def test_the_checks_pass_two_draws_counted_twice(tmp_path: Path) -> None:
    assert check(made_up_outcome(tmp_path, same_draw=False, rows_recorded=2)) == []


def test_the_independent_accountant_matches_the_gaussian_composition() -> None:
    # two releases at z compose as one at z / sqrt(2): the same epsilon
    assert independent_epsilon([2.0, 2.0], DELTA) == pytest.approx(
        independent_epsilon([2.0 / np.sqrt(2)], DELTA), rel=1e-9
    )
    assert independent_epsilon([], DELTA) == 0.0
