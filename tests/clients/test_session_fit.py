"""A worker's backbone against its session's (``clients.session_fit.options_for_session``): the
session names the backbone ``glasu session create`` chose its settings for; a worker without
its own takes it, one given another refuses. No service: session settings as JSON."""

from __future__ import annotations

import pytest

from clients.session_fit import (
    DEFAULT_BACKBONE,
    LocalModelOptions,
    SessionMismatch,
    client_config_from_session,
    options_for_session,
)
from models.config import BackboneName
from secure.wire.sessions import BACKBONE_PATTERN

SESSION = {
    "privacy": None, "agg_layers": [{"layer": 1, "width": 16}], "layers": 1, "stale": 1,
    "fanout": 3, "seed": 0,
}  # fmt: skip


def test_a_worker_without_a_backbone_takes_the_session_s() -> None:
    session = {**SESSION, "backbone": "sign"}
    assert options_for_session(session, LocalModelOptions()).backbone == "sign"
    assert client_config_from_session(session, LocalModelOptions()).model.backbone == "sign"


def test_a_session_that_names_none_leaves_the_worker_s_own_or_the_default() -> None:
    assert options_for_session(SESSION, LocalModelOptions()).backbone == DEFAULT_BACKBONE
    own = LocalModelOptions(backbone="gcn")
    assert options_for_session({**SESSION, "backbone": None}, own).backbone == "gcn"


def test_a_worker_given_the_session_s_backbone_runs_it_and_another_is_refused() -> None:
    session = {**SESSION, "backbone": "sign"}
    assert options_for_session(session, LocalModelOptions(backbone="sign")).backbone == "sign"
    with pytest.raises(SessionMismatch, match="--backbone gcnii differs from the session's"):
        client_config_from_session(session, LocalModelOptions(backbone="gcnii"))


def test_a_backbone_the_worker_lacks_is_refused() -> None:
    """A newer operator's, or a lying service's, name: refused before anything is built."""
    with pytest.raises(SessionMismatch, match="'mystery', which this worker lacks"):
        options_for_session({**SESSION, "backbone": "mystery"}, LocalModelOptions())


def test_the_session_takes_every_backbone_name() -> None:
    """secure/ spells the names with a pattern (it never imports models/)."""
    import re
    from typing import get_args

    assert all(re.fullmatch(BACKBONE_PATTERN, name) for name in get_args(BackboneName))


def test_the_session_s_worker_defaults_fill_in_what_the_owner_did_not_give() -> None:
    session = {**SESSION, "backbone": "sign", "worker_defaults": {"hops": 10, "lr": 0.002}}
    taken = options_for_session(session, LocalModelOptions())
    assert (taken.hops, taken.lr) == (10, 0.002)
    own = options_for_session(session, LocalModelOptions(lr=0.05), given={"lr"})
    assert (own.hops, own.lr) == (10, 0.05)  # the owner's own setting stays


@pytest.mark.parametrize(
    ("defaults", "says"),
    [
        ({"lr": -1.0}, "not a valid --lr"),
        ({"hops": 1.5}, "not a valid --hops"),
        ({"dropout": "high"}, "not a valid --dropout"),
        ({"noise_seed": 1}, "no setting of this worker that a session may set"),
        ({"hidden": 64}, "no setting of this worker that a session may set"),
        ({"surprise": 1}, "no setting of this worker that a session may set"),
    ],
)
def test_a_default_the_worker_cannot_take_is_refused(defaults: dict, says: str) -> None:
    """Checked as the worker setting of its name is, even where the owner gave its own; never
    the noise seed (a service must not fix a worker's noise) nor what the session sets itself."""
    with pytest.raises(SessionMismatch, match=says):
        options_for_session({**SESSION, "worker_defaults": defaults}, LocalModelOptions())
