"""The organisation's privacy report (``glasu report``): its own ledgers, composed at its own
policy's delta with its own accountant, turned into the report's content (``secure.report``),
which ``secure.report_html`` renders.

Every figure comes from the owner's ledger rows (``clients/owner_ledger.py``), read once per
ledger: a session's epsilon composes its rows, the total composes all of them, and each
adversary's figure composes the rows scaled by how much noise that adversary faces relative to
the ledger's (recorded when the worker admitted the session). Several ledgers (several data
folders) are added up as if they held the same data: exact when they do, conservative when they
do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clients.owner_ledger import LedgerSnapshot
from clients.policy import PrivacyPolicy
from secure.privacy import NOT_PROTECTED, PRIVACY_UNIT
from secure.report import (
    REPORT_FORMAT,
    WHO,
    advantage,
    adversary_figure,
    cap_figure,
    iso_utc,
    local_offset,
    sentence,
    shares_sentence,
)

#: Against whom the ledger's own figure holds (the default, unshared noise).
LEDGER_WHO = WHO["colluding"]
ADVERSARY_ORDER = ("service", "peer", "service_peer", "colluding", "group")
#: Lines only some sessions have: the lifetime shows them only when one does ("service_peer":
#: split noise; "group": recorded by workers since it was added).
SOME_SESSIONS = ("service_peer", "group")
OLD_SESSION_NOTE = (
    "recorded by an older worker: the session's partners, operator and adversaries are not known"
)


def organisation_content(
    snapshots: Sequence[LedgerSnapshot],
    *,
    policy: PrivacyPolicy,
    generated_at: float,
    title: str | None = None,
    accuracies: Mapping[str, Mapping[str, float | None]] | None = None,
) -> dict[str, Any]:
    """The report's content; ``accuracies``: by session id, ``federated`` and ``alone`` test
    accuracy from elsewhere (a worker's ``--result`` file) where the ledger has none."""

    def epsilon(inverse_square_sum: float) -> float:
        return policy.epsilon_of(inverse_square_sum)

    rows = sorted(
        (row for snap in snapshots for row in snap.releases), key=lambda r: r["released_at"]
    )
    records: dict[str, dict[str, Any]] = {}
    for snap in snapshots:
        records.update(snap.sessions)
    order: list[str] = []
    for row in rows:
        if row["session_id"] not in order:
            order.append(row["session_id"])
    sessions = []
    peers_service: dict[str, float] = {}  # sessions without the line: their colluding figure
    lifetime: dict[str, float] = {}
    unknown: dict[str, int] = {}
    for sid in order:
        own = [r for r in rows if r["session_id"] == sid]
        inverse = sum(1.0 / r["noise_multiplier"] ** 2 for r in own)
        record = records.get(sid, {})
        found = {a["key"]: a for a in record.get("adversaries") or []}
        adversaries = []
        for key in ADVERSARY_ORDER:
            if key == "service_peer" and key not in found:
                # without split noise the service with one key-holding peer can read a share:
                # the colluding figure (not a line of this session, but part of the lifetime's)
                faced_key = _faced(own, "colluding", found.get("colluding", {}).get("factor", 1))
                if faced_key is not None:
                    peers_service[sid] = faced_key
                continue
            if key not in found:
                if key != "group":  # an older record: the ledger's own figure, as it faces
                    lifetime[key] = lifetime.get(key, 0.0) + inverse
                else:
                    unknown[key] = unknown.get(key, 0) + 1
                continue
            scaled = _faced(own, key, found[key]["factor"])
            if scaled is not None:
                lifetime[key] = lifetime.get(key, 0.0) + scaled
            adversaries.append(
                _adversary(key, found[key]["adversary"], scaled, epsilon, policy.delta)
            )
        if not found:
            adversaries.append(
                _adversary(
                    "ledger",
                    f"the ledger's figure ({OLD_SESSION_NOTE})",
                    inverse,
                    epsilon,
                    policy.delta,
                )
            )
        measured = {
            "federated": record.get("test_accuracy"),
            "alone": record.get("reference_test_accuracy"),
        }
        if measured["federated"] is None and accuracies and sid in accuracies:
            measured = dict(accuracies[sid])
        sessions.append(
            {
                "session_id": sid,
                "label": record.get("label"),
                "partners": record.get("partners"),
                "operator": record.get("operator"),
                "kind": record.get("kind") or "not recorded",
                "created_at": iso_utc(record.get("created_at")),
                "first_release_at": iso_utc(own[0]["released_at"]),
                "last_release_at": iso_utc(own[-1]["released_at"]),
                "releases": len(own),
                "by_kind": _by_kind(own),
                "shares": shares_sentence(record.get("encoding")),
                "predictions_shared": record.get("predictions_shared") or 0,
                "epsilon": epsilon(inverse),
                "adversaries": adversaries,
                "accuracy": measured if measured.get("federated") is not None else None,
            }
        )
    total_inverse = sum(1.0 / r["noise_multiplier"] ** 2 for r in rows)
    total = epsilon(total_inverse)
    if "service_peer" in lifetime:
        lifetime["service_peer"] += sum(peers_service.values())
    lifetime_adversaries = []
    for key in ADVERSARY_ORDER:
        if key in SOME_SESSIONS and key not in lifetime:
            continue
        name = WHO[key]
        if key == "group" and unknown.get(key):
            name += f" ({unknown[key]} session(s) of an older worker not included)"
        lifetime_adversaries.append(_adversary(key, name, lifetime.get(key), epsilon, policy.delta))
    cumulative, timeline = 0.0, []
    for row in rows:
        cumulative += 1.0 / row["noise_multiplier"] ** 2
        timeline.append({"x": row["released_at"], "epsilon": epsilon(cumulative)})
    partners = sorted({p for s in sessions for p in s["partners"] or []})
    operators = sorted({s["operator"] for s in sessions if s["operator"]})
    warnings = []
    if any(not records.get(sid) for sid in order):
        warnings.append(
            f"Some sessions were {OLD_SESSION_NOTE}; their figures are the ledger's, which hold"
            f" against {LEDGER_WHO} unless the session used shared noise."
        )
    if any(row.get("adversaries") for row in rows):
        warnings.append(
            "Some sessions split the noise between the partners (docs/privacy.md section 11):"
            f" for them the ledger's figure holds against {WHO['service_peer']}, not against"
            " all the other partners together (their own line shows that)."
        )
    largest = max((s["epsilon"] for s in sessions), default=0.0)
    if largest > policy.max_session_epsilon or total > policy.max_lifetime_epsilon:
        warnings.append(
            "A figure is above this report's caps: the caps given here are not the ones the"
            " worker enforced when it released (check the worker's policy settings)."
        )
    return {
        "format": REPORT_FORMAT,
        "scope": "organisation",
        "title": title or "Privacy report: what this organisation's data has released",
        "generated_at": iso_utc(generated_at),
        "local_offset": local_offset(),
        "delta": policy.delta,
        "accountant": policy.accountant,
        "privacy_unit": PRIVACY_UNIT,
        "partners": partners or None,
        "operators": operators or None,
        "first_release_at": iso_utc(rows[0]["released_at"]) if rows else None,
        "last_release_at": iso_utc(rows[-1]["released_at"]) if rows else None,
        "sessions": sessions,
        "total": {
            "releases": len(rows),
            "by_kind": _by_kind(rows),
            "predictions_shared": sum(s["predictions_shared"] for s in sessions),
            "epsilon": total,
            "holds_against": f"the caps' figure, against {LEDGER_WHO}",
            "sentence": sentence(
                who=LEDGER_WHO,
                epsilon=total,
                advantage=advantage(total_inverse),
                delta=policy.delta,
            ),
        },
        "adversaries": lifetime_adversaries,
        "caps": [
            cap_figure("lifetime cap", limit=policy.max_lifetime_epsilon, spent=total),
            cap_figure(
                "per-session cap (largest session)",
                limit=policy.max_session_epsilon,
                spent=largest,
                largest_session=True,
            ),
        ],
        "timeline": timeline,
        "timeline_axis": "time",
        "timeline_note": "Epsilon of every release so far, composed over all sessions (the"
        " ledger's figure, the one the lifetime cap applies to); dashed lines: the caps.",
        "not_protected": list(NOT_PROTECTED),
        "ledgers": [
            {
                "name": snap.path.parent.name or str(snap.path),
                "sha256": snap.digest,
                "releases": len(snap.releases),
            }
            for snap in snapshots
        ],
        "warnings": warnings,
    }


def _adversary(
    key: str, name: str, inverse: float | None, epsilon: Any, delta: float
) -> dict[str, Any]:
    return adversary_figure(
        key=key,
        name=name,
        who=WHO.get(key, LEDGER_WHO),
        epsilon=None if inverse is None else epsilon(inverse),
        inverse=inverse,
        delta=delta,
    )


def _faced(rows: Sequence[Mapping[str, Any]], key: str, factor: float | None) -> float | None:
    """The sum of 1 / z^2 over ``rows`` as adversary ``key`` faced them: a split-noise row's own
    figure for it, else the row's z scaled by the session's ``factor`` (None: it sees none)."""
    own = [row["adversaries"][key] for row in rows if key in (row.get("adversaries") or {})]
    rest = [row for row in rows if key not in (row.get("adversaries") or {})]
    seen = [z for z in own if z is not None]
    if not seen and (factor is None or not rest):
        return None
    scaled = 0.0 if factor is None else sum(1.0 / r["noise_multiplier"] ** 2 for r in rest) * factor
    return scaled + sum(1.0 / z**2 for z in seen)


def _by_kind(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        kind = row.get("kind") or "not recorded"
        counts[kind] = counts.get(kind, 0) + 1
    return counts
