"""Online scoring (docs/data.md, "Online scoring"): a scoring session created with ``online``
stays open, and each request of its answering party opens one scoring session over the asked
nodes, its *request session* ``<online id>-<n>``. A request session is planned, gated and
accounted exactly as a batch scoring session (one evaluation pass, one release in every
owner's ledger); its pass is a ``sampled`` one (the asked nodes' sampled neighbourhoods only, as
a training pass samples them), so what a request costs grows with the nodes asked, not with
those loaded. The requests of a private sign model's online session (``model_kind``
'release') are planned as its batch scoring is, with no release: each sender's kept block's
rows of the asked nodes (:func:`request_pass`). The online session's workers run it with their
tokens of the online session (``service/api/deps.py``), so that a request needs no token handed
out; they wait for the next request with :func:`next_request` (a long poll)."""

from __future__ import annotations

import numpy as np

from secure.protocol import answering_party
from secure.wire.request_signature import RequestSignature
from secure.wire.sessions import ScoringPass, ScoringRequestOpened, request_session_id
from service.domain_errors import InvalidSessionRequest, SessionClosed
from service.plan import SessionPlan
from service.rounds import RoundEngine
from service.session_state import SessionState
from service.store import Store, Transaction

#: Refused nodes named in an error, at most
NAMED_NODES = 10


def asker_of(plan: SessionPlan) -> int:
    """The client whose token asks an online session for predictions: the answering party."""
    return answering_party(plan.config.label_holder)


def open_request(
    store: Store,
    engine: RoundEngine,
    online_id: str,
    nodes: np.ndarray,
    signature: RequestSignature | None = None,
) -> tuple[ScoringRequestOpened, SessionPlan]:
    """Open the next request session of ``online_id`` over ``nodes`` (sorted, distinct): refused
    (nothing opened) unless the session is an open online session and covers every node. The
    answering party's ``signature`` is kept with it as given: the workers check it."""
    with store.transaction() as tx:
        row, online = engine.session(tx, online_id)
        _check_open(online_id, row.state, online)
        nodes = np.unique(np.asarray(nodes, dtype=np.int64))
        missing = _not_covered(nodes, online.config.eval_nodes)
        if missing.size:
            named = ", ".join(str(n) for n in missing[:NAMED_NODES])
            more = f" and {missing.size - NAMED_NODES} more" if missing.size > NAMED_NODES else ""
            raise InvalidSessionRequest(
                f"not among the online session's aligned nodes, so not scored: {named}{more}"
            )
        number = _next_number(tx, online_id)
        session_id = request_session_id(online_id, number)
        config = online.config.model_copy(
            update={
                "online": False,
                "eval_nodes": nodes,
                "scoring_pass": request_pass(online),
                "label": f"request {number} of online session {online_id}",
                "request_signature": signature,
            }
        )
        plan = SessionPlan.build(
            session_id,
            config,
            noise_multiplier_source=(
                online.privacy.noise_multiplier_source if online.privacy else "given"
            ),
            public_context_sha256=online.public_context_sha256,
        )
        tx.insert_session(session_id, plan.to_json(), [])  # its workers use the online tokens
    return ScoringRequestOpened(request=number, session_id=session_id), plan


def request_pass(online: SessionPlan) -> ScoringPass:
    """How a request session's pass covers the asked nodes: their sampled neighbourhoods only
    (a request costs its nodes, not N); for the models of a release session (the private sign
    design, ``SessionPlan.post_processing``) the asked nodes' rows of each sender's kept block,
    post-processing with no release, as its batch scoring is planned."""
    return "all-nodes" if online.post_processing else "sampled"


def _not_covered(nodes: np.ndarray, covered: np.ndarray) -> np.ndarray:
    """The ``nodes`` not in ``covered`` (sorted): O(asked x log covered), not O(covered)."""
    at = np.minimum(np.searchsorted(covered, nodes), covered.size - 1)
    return nodes[covered[at] != nodes]


def _check_open(online_id: str, state: str, online: SessionPlan) -> None:
    if not online.config.online:
        raise InvalidSessionRequest(
            f"session {online_id!r} is not an online scoring session (create one with "
            "`glasu session create --score-with ... --online`)"
        )
    if state != SessionState.RUNNING:
        raise SessionClosed(online_id)


def _next_number(tx: Transaction, online_id: str) -> int:
    """The first request number not taken (requests are numbered 1, 2, ... without gaps): found
    by doubling then bisecting, O(log n) reads, under the lock that session creations take, so
    two requests never take the same number."""
    tx.lock("listing-order", "sessions")  # before reading, on PostgreSQL too
    taken = 0  # every number <= taken is in use
    free = 1
    while tx.session(request_session_id(online_id, free)) is not None:
        taken, free = free, free * 2
    while free - taken > 1:
        middle = (taken + free) // 2
        if tx.session(request_session_id(online_id, middle)) is not None:
            taken = middle
        else:
            free = middle
    return free


def request_opened(tx: Transaction, engine: RoundEngine, online_id: str, number: int) -> bool:
    """Whether request ``number`` of ``online_id`` is opened; :class:`SessionClosed` when it is
    not and the online session no longer takes requests (a worker waiting for the next request
    stops)."""
    if tx.session(request_session_id(online_id, number)) is not None:
        return True
    row, online = engine.session(tx, online_id)
    _check_open(online_id, row.state, online)
    return False
