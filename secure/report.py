"""The privacy report's content: the figures and the sentences people read, as plain JSON, for
an organisation's ledgers (``glasu report``: ``clients/privacy_report.py``) or one session (the
service's ``GET /v1/sessions/{id}/report``: :func:`session_content`). ``secure/report_html.py``
renders either as the same page; signing is in ``clients/report_signing.py`` (the owner's side:
the service image has no PyNaCl). Torch-free and matplotlib-free: the service imports it.

The plain-language sentence under each epsilon turns it into what docs/privacy.md section 1.1
says it means: a bound on how much better than chance anyone holding every release can tell
whether one node's feature row was one value or another. The bound used is the exact one of the
Gaussian mechanism (Gaussian DP: true-positive minus false-positive rate at most
``2 Phi(mu / 2) - 1`` with ``mu = sqrt(sum 1 / z_i^2)``), which is what the ledger composes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

REPORT_FORMAT = "glasu-privacy-report/1"
KINDS = ("training", "evaluation", "scoring")

#: Against whom a figure holds, for people (keys: ``secure.privacy.Adversary.key``).
WHO = {
    "service": "the operator's service on its own",
    "peer": "any one partner on its own",
    "service_peer": "the operator's service together with any one partner",
    "colluding": "all the other partners together, with or without the operator's service",
    "group": "one partner, about a node whose rows sit at every organisation at once",
}

#: Who could read a partner's share, by the session's share encoding
#: (``secure.protocol.ShareEncoding``; docs/secure-aggregation.md, docs/threat-model.md).
SHARES = {
    "bfv-masked": "masked (secure aggregation): each share masked pairwise and encrypted under"
    " BFV; the service saw ciphertexts and their sum, and no one, not even the service with one"
    " partner, could read another partner's share: only the sum of every partner's share decodes",
    "ckks": "encrypted under CKKS, whose one key every partner holds: the service alone saw"
    " ciphertexts, but the service with one partner, or a service that served one partner's"
    " share as a sum, could read that share",
    "float32": "not encrypted: the service read every partner's share",
}


def shares_sentence(encoding: str | None) -> str:
    """Who could read a share, for a session whose shares travelled as ``encoding``."""
    if encoding is None:
        return "not recorded (a session admitted by an older worker)"
    return SHARES.get(encoding, f"encoding {encoding!r}")


def iso_utc(epoch: float | None) -> str | None:
    """``2025-03-01T14:02:07Z``; None stays None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cap_figure(
    name: str, *, limit: float, spent: float, largest_session: bool = False
) -> dict[str, Any]:
    """A cap on epsilon, what was spent of it and what is left, and the sentence that says so
    to a compliance officer; ``largest_session``: a cap on each session, ``spent`` the largest
    session's."""
    left = max(limit - spent, 0.0)
    if largest_session:
        text = (
            f"The largest session spent epsilon {spent:.4g} of the cap of {limit:g} per session,"
            f" {left:.4g} left; each new session may spend up to {limit:g}."
        )
    else:
        text = f"Spent epsilon {spent:.4g} of the {name} of {limit:g}, {left:.4g} left."
    return {"name": name, "limit": limit, "spent": spent, "left": left, "sentence": text}


def local_offset() -> str:
    """This machine's offset from UTC now, ``+01:00``."""
    offset = datetime.now().astimezone().utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def advantage(inverse_square_sum: float) -> float:
    """How much an adversary's true-positive rate can exceed its false-positive rate, at best,
    after Gaussian releases whose 1 / z_i^2 add up to ``inverse_square_sum``."""
    mu = math.sqrt(max(inverse_square_sum, 0.0))
    return math.erf(mu / (2.0 * math.sqrt(2.0)))  # 2 Phi(mu / 2) - 1


def sentence(*, who: str, epsilon: float | None, advantage: float | None, delta: float) -> str:
    """Epsilon in plain words (docs/privacy.md section 1.1), against ``who``."""
    if epsilon is None or advantage is None:
        return f"Against {who}: nothing to account, it sees no release (only ciphertexts)."
    return (
        f"Against {who}: whatever test they run on everything they received to tell whether one"
        f" node's feature row was one value or another, they can be right at most"
        f" {100 * advantage:.1f} percentage points more often than chance (epsilon"
        f" {epsilon:.3g}, delta {delta:g}: the bound fails with probability at most delta)."
    )


def adversary_figure(
    *,
    key: str | None,
    name: str,
    who: str,
    epsilon: float | None,
    inverse: float | None,
    delta: float,
) -> dict[str, Any]:
    """One adversary's line of the report: its epsilon and that epsilon in plain words.
    ``inverse``: the sum of 1 / z_i^2 of the releases as it faces them (None: it sees none)."""
    return {
        "key": key,
        "adversary": name,
        "epsilon": epsilon,
        "sentence": sentence(
            who=who,
            epsilon=epsilon,
            advantage=None if inverse is None else advantage(inverse),
            delta=delta,
        ),
    }


# -- one session, from the service -------------------------------------------------------------


def session_content(
    status: Mapping[str, Any],
    *,
    pass_kinds: Sequence[str],
    generated_at: float,
) -> dict[str, Any]:
    """The content of the operator's page for one session: ``status`` is ``GET
    /v1/sessions/{id}`` (its ``privacy`` field, the service's ledger), ``pass_kinds`` each
    pass's kind ("train", "eval")."""
    config, privacy = status["config"], status["privacy"]
    # a scoring session's pass is a scoring release; a release session's (the private sign
    # design's one pass) a training release
    one_kind = {"scoring": "scoring", "release": "training"}.get(config.get("kind", ""))
    delta = privacy.get("delta") or 0.0
    entries = privacy.get("ledger", [])
    by_kind: dict[str, int] = {}
    for e in entries:
        kind = (
            one_kind
            if one_kind is not None
            else {"train": "training", "eval": "evaluation"}.get(
                pass_kinds[e["pass_index"]], "not recorded"
            )
        )
        by_kind[kind] = by_kind.get(kind, 0) + 1
    first = iso_utc(entries[0]["released_at"]) if entries else None
    last = iso_utc(entries[-1]["released_at"]) if entries else None
    adversaries = []
    for a in privacy.get("adversaries", []):
        z = a.get("noise_multiplier")
        adversaries.append(
            adversary_figure(
                key=a.get("key"),
                name=a["adversary"],
                who=WHO.get(a.get("key") or "", a["adversary"]),
                epsilon=a.get("epsilon"),
                inverse=None if z is None else len(entries) / z**2,
                delta=delta,
            )
        )
    ledger_z = privacy.get("ledger_noise_multiplier")
    spent = privacy.get("epsilon")
    masked = config.get("encoding") == "bfv-masked"
    if privacy.get("split_noise") and masked:
        holds = "any one partner, alone or with the service (split noise under masks)"
    elif privacy.get("split_noise"):  # CKKS: the service with one partner can read a share
        holds = "any one partner on its own (split noise without masks)"
    elif privacy.get("shared_noise"):
        holds = "one curious partner that does not collude (shared noise)"
    else:
        holds = "all the other partners together, with or without the service"
    warnings = []
    if not privacy.get("enabled"):
        warnings.append(
            "Differential privacy is OFF for this session: nothing bounds what the shares reveal."
        )
    if "NOT PRIVATE" in str(privacy.get("noise", "")):
        warnings.append(f"The noise was {privacy['noise']}.")
    target = privacy.get("epsilon_target")
    session = {
        "session_id": status["session_id"],
        "label": status.get("label"),
        "partners": config.get("partners"),
        "operator": config.get("operator"),
        "kind": config.get("kind", "training"),
        "created_at": iso_utc(status.get("created_at")),
        "first_release_at": first,
        "last_release_at": last,
        "releases": len(entries),
        "by_kind": by_kind,
        "shares": shares_sentence(config.get("encoding")),
        "epsilon": spent,
        "adversaries": adversaries,
        "accuracy": None,
    }
    return {
        "format": REPORT_FORMAT,
        "scope": "session",
        "title": f"Privacy report: session {status.get('label') or status['session_id']}",
        "generated_at": iso_utc(generated_at),
        "local_offset": "+00:00",
        "delta": delta,
        "accountant": privacy.get("accountant") or "none",
        "privacy_unit": privacy.get("privacy_unit") or "nothing (no differential privacy)",
        "partners": config.get("partners"),
        "operators": [config["operator"]] if config.get("operator") else None,
        "first_release_at": first,
        "last_release_at": last,
        "sessions": [session],
        "total": {
            "releases": len(entries),
            "by_kind": by_kind,
            "epsilon": spent,
            "holds_against": f"against {holds}",
            "sentence": sentence(
                who=holds,
                epsilon=spent,
                advantage=None if not ledger_z else advantage(len(entries) / ledger_z**2),
                delta=delta,
            )
            if privacy.get("enabled")
            else "No differential privacy: no bound.",
        },
        "adversaries": adversaries,
        "caps": []
        if target is None
        else [cap_figure("session target", limit=target, spent=spent or 0.0)],
        "timeline": [{"x": e["release"], "epsilon": e["epsilon"]} for e in entries],
        "timeline_axis": "release",
        "timeline_note": "Epsilon after each release the service counted (its own ledger);"
        " the dashed line is the session's target.",
        "not_protected": privacy.get("not_protected", []),
        "ledgers": [],
        "warnings": warnings,
    }
