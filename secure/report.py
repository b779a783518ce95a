"""The privacy report people read: one self-contained HTML page (inline CSS, inline SVG chart,
no script that runs, nothing fetched), for an organisation's ledgers (``glasu report``) or one
session (the service's ``GET /v1/sessions/{id}/report``).

Both build a *content* dict (plain JSON: the figures, already computed, and the sentences) and
render it here, so the two pages have the same sections and wording. Torch-free and
matplotlib-free: the service imports it. Signing is in ``clients/report_signing.py`` (the
owner's side: the service image has no PyNaCl).

The plain-language sentence under each epsilon turns it into what docs/privacy.md section 1.1
says it means: a bound on how much better than chance anyone holding every release can tell
whether one node's feature row was one value or another. The bound used is the exact one of the
Gaussian mechanism (Gaussian DP: true-positive minus false-positive rate at most
``2 Phi(mu / 2) - 1`` with ``mu = sqrt(sum 1 / z_i^2)``), which is what the ledger composes.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

REPORT_FORMAT = "glasu-privacy-report/1"
#: The signature's place in an HTML report: this slot is signed, then replaced by the signature.
SIGNATURE_SLOT = "0" * 128
DATA_ELEMENT = "glasu-report-data"
SIGNATURE_ELEMENT = "glasu-signature"
KINDS = ("training", "evaluation", "scoring")

#: Against whom a figure holds, for people (keys: ``secure.privacy.Adversary.key``).
WHO = {
    "service": "the operator's service on its own",
    "peer": "any one partner on its own",
    "colluding": "all the other partners together, with or without the operator's service",
    "group": "one partner, about a node whose rows sit at every organisation at once",
}
GROUP_NOTE = (
    "This figure is for a larger unit than the one the caps and the target protect: the same"
    " node's rows at every organisation changing together (like protecting a group instead of"
    " one person). The target applies to one organisation's row, so this figure can be above it"
    " without any budget being overspent; it is stated so that nobody mistakes the one for the"
    " other."
)


def iso_utc(epoch: float | None) -> str | None:
    """``2025-03-01T14:02:07Z``; None stays None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _fmt(value: float | None, digits: int = 3) -> str:
    return "not recorded" if value is None else f"{value:.{digits}g}"


def _epsilon_cell(value: float | None) -> str:
    return "none: sees no release" if value is None else f"{value:.3g}"


def _names(values: Sequence[str] | None) -> str:
    return ", ".join(values) if values else "not recorded"


def _esc(value: Any) -> str:
    return html.escape("not recorded" if value is None else str(value), quote=True)


def embedded_json(content: Mapping[str, Any]) -> str:
    """JSON that cannot end its ``<script>`` element early."""
    text = json.dumps(content, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


# -- the chart ---------------------------------------------------------------------------------


def cumulative_chart(
    points: Sequence[tuple[float, float]],
    *,
    caps: Sequence[tuple[float, str]],
    x_is_time: bool,
    width: int = 760,
    height: int = 300,
) -> str:
    """Cumulative epsilon (a step line) over time (epoch seconds) or release number, with each
    cap a dashed horizontal line; inline SVG."""
    left, right, top, bottom = 56, 20, 16, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for x, _ in points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x1 = x0 + 1.0
    y1 = max([y for _, y in points] + [c for c, _ in caps] + [1e-9]) * 1.1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - y / y1 * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" role="img"'
        ' aria-label="cumulative epsilon over time, with the caps">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff"'
        ' stroke="#999"/>',
    ]
    for i in range(5):
        y = y1 * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(y):.1f}" y2="{sy(y):.1f}"'
            ' stroke="#eee"/>'
            f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11">'
            f"{y:.2g}</text>"
        )
    for i in range(3):
        x = x0 + (x1 - x0) * i / 2
        label = (iso_utc(x) or "")[:16].replace("T", " ") if x_is_time else f"{x:.0f}"
        parts.append(
            f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle"'
            f' font-size="11">{_esc(label)}</text>'
        )
    axis = "time (UTC)" if x_is_time else "release"
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle"'
        f' font-size="12">{axis}</text>'
        f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" font-size="12"'
        f' transform="rotate(-90 14 {top + plot_h / 2:.1f})">epsilon</text>'
    )
    for value, label in caps:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(value):.1f}" y2="{sy(value):.1f}"'
            ' stroke="#b00" stroke-dasharray="6 4"/>'
            f'<text x="{left + plot_w - 4}" y="{sy(value) - 4:.1f}" text-anchor="end"'
            f' font-size="11" fill="#b00">{_esc(label)} {value:g}</text>'
        )
    if points:
        path = [f"M{sx(points[0][0]):.1f},{sy(0.0):.1f}"]
        for x, y in points:
            path.append(f"H{sx(x):.1f}V{sy(y):.1f}")
        parts.append(f'<path d="{" ".join(path)}" fill="none" stroke="#1f5fa8" stroke-width="2"/>')
    parts.append("</svg>")
    return "".join(parts)


# -- the page ----------------------------------------------------------------------------------

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:2em auto;
max-width:62em;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ccc;
margin-top:1.6em}
table{border-collapse:collapse;width:100%;margin:.5em 0}th,td{border:1px solid #ccc;
padding:.3em .5em;text-align:left;vertical-align:top}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.answer{background:#f5f8fc;border-left:4px solid #1f5fa8;padding:.5em 1em}
.warn{background:#fff6e5;border-left:4px solid #c80;padding:.5em 1em}
.muted{color:#666}code{font-size:.95em}
.chart{max-width:100%;height:auto}
@media print{body{margin:0;max-width:none;font-size:11pt}h2{break-after:avoid}
table,.chart,.answer{break-inside:avoid}a{color:inherit;text-decoration:none}}
"""


def render_html(content: Mapping[str, Any], *, signature: Mapping[str, Any] | None = None) -> str:
    """The page of ``content``. ``signature`` (algorithm, public_key, fingerprint) adds the
    signature element with :data:`SIGNATURE_SLOT` in its place, for the signer to fill in."""
    c = content
    delta = c["delta"]
    out: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(c['title'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(c['title'])}</h1>",
        f'<p class="muted">Generated {_esc(c["generated_at"])} (UTC; the machine that wrote it'
        f" was at UTC{_esc(c['local_offset'])}). All times in this report are UTC, written"
        " YYYY-MM-DDThh:mm:ssZ.</p>",
    ]
    out += _summary(c)
    out += _who_and_when(c)
    out += _spent(c, delta)
    out += _chart(c)
    out += _not_protected(c)
    out += _accuracy(c)
    out += _verification(c, signature)
    out.append(f'<script type="application/json" id="{DATA_ELEMENT}">{embedded_json(c)}</script>')
    if signature is not None:
        element = {**signature, "signature": SIGNATURE_SLOT}
        out.append(
            f'<script type="application/json" id="{SIGNATURE_ELEMENT}">'
            f"{json.dumps(element, sort_keys=True)}</script>"
        )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _summary(c: Mapping[str, Any]) -> list[str]:
    total = c["total"]
    lines = [
        "<h2>In short</h2>",
        '<div class="answer"><ul>',
        f"<li><b>With whom:</b> {_esc(_names(c['partners']))}; operated by"
        f" {_esc(_names(c['operators']))}.</li>",
        f"<li><b>When:</b> {_esc(c['first_release_at'] or 'no release')} to"
        f" {_esc(c['last_release_at'] or 'no release')} (UTC).</li>",
        f"<li><b>Released:</b> {total['releases']} release(s) in {len(c['sessions'])}"
        f" session(s): {_esc(_kinds(total['by_kind']))}.</li>",
        f"<li><b>Spent:</b> epsilon {_fmt(total['epsilon'])} at delta {c['delta']:g}"
        f" ({_esc(total['holds_against'])}).</li>",
    ]
    for cap in c["caps"]:
        left = cap["limit"] - (total["epsilon"] or 0.0)
        lines.append(
            f"<li><b>Left:</b> epsilon {max(left, 0.0):.3g} of the {_esc(cap['name'])}"
            f" {cap['limit']:g}.</li>"
        )
    if not c["caps"]:
        lines.append("<li><b>Left:</b> no cap was set for this report.</li>")
    lines.append(f"<li>{_esc(total['sentence'])}</li></ul></div>")
    if c.get("warnings"):
        lines += [f'<p class="warn">{_esc(w)}</p>' for w in c["warnings"]]
    return lines


def _kinds(by_kind: Mapping[str, int]) -> str:
    parts = [f"{by_kind.get(k, 0)} {k}" for k in KINDS if by_kind.get(k)]
    if by_kind.get("not recorded"):
        parts.append(f"{by_kind['not recorded']} of a kind not recorded (older ledger)")
    return ", ".join(parts) or "none"


def _who_and_when(c: Mapping[str, Any]) -> list[str]:
    rows = [
        "<h2>Sessions: with whom, when, what was released</h2>",
        "<table><tr><th>session</th><th>partners</th><th>operator</th><th>kind</th>"
        "<th>created (UTC)</th><th>releases (UTC)</th><th>released</th></tr>",
    ]
    for s in c["sessions"]:
        rows.append(
            f"<tr><td>{_esc(s['label'] or 'no label')}<br><code class=muted>"
            f"{_esc(s['session_id'])}</code></td><td>{_esc(_names(s['partners']))}</td>"
            f"<td>{_esc(s['operator'])}</td><td>{_esc(s['kind'])}</td>"
            f"<td>{_esc(s['created_at'])}</td>"
            f"<td>{_esc(s['first_release_at'])} to {_esc(s['last_release_at'])}</td>"
            f'<td class="num">{s["releases"]}: {_esc(_kinds(s["by_kind"]))}</td></tr>'
        )
    rows.append("</table>")
    return rows


def _spent(c: Mapping[str, Any], delta: float) -> list[str]:
    out = [
        "<h2>Budget spent, and against whom it holds</h2>",
        f"<p>What is protected: {_esc(c['privacy_unit'])}. Epsilon is stated at delta"
        f" {delta:g} with the {_esc(c['accountant'])} accountant; a smaller epsilon is a"
        " stronger guarantee.</p>",
        "<table><tr><th>session</th><th>against</th><th class=num>epsilon</th>"
        "<th>in plain words</th></tr>",
    ]
    for s in c["sessions"]:
        for a in s["adversaries"]:
            note = f"<br><i>{_esc(GROUP_NOTE)}</i>" if a["key"] == "group" else ""
            out.append(
                f"<tr><td>{_esc(s['label'] or s['session_id'])}</td>"
                f"<td>{_esc(a['adversary'])}</td>"
                f'<td class="num">{_epsilon_cell(a["epsilon"])}</td>'
                f"<td>{_esc(a['sentence'])}{note}</td></tr>"
            )
    out.append("</table>")
    if len(c["sessions"]) > 1 or c["scope"] == "organisation":
        out += [
            "<h3>In total, over every session</h3>",
            "<table><tr><th>against</th><th class=num>epsilon</th><th>in plain words</th></tr>",
        ]
        for a in c["adversaries"]:
            note = f"<br><i>{_esc(GROUP_NOTE)}</i>" if a["key"] == "group" else ""
            out.append(
                f"<tr><td>{_esc(a['adversary'])}</td>"
                f"<td class=num>{_epsilon_cell(a['epsilon'])}</td>"
                f"<td>{_esc(a['sentence'])}{note}</td></tr>"
            )
        out.append("</table>")
    if c["caps"]:
        out += ["<h3>Budget left</h3>", "<table><tr><th>cap</th><th class=num>limit</th>"]
        out.append("<th class=num>spent</th><th class=num>left</th></tr>")
        for cap in c["caps"]:
            out.append(
                f"<tr><td>{_esc(cap['name'])}</td><td class=num>{cap['limit']:g}</td>"
                f"<td class=num>{_fmt(cap['spent'])}</td>"
                f"<td class=num>{max(cap['limit'] - cap['spent'], 0.0):.3g}</td></tr>"
            )
        out.append("</table>")
    return out


def _chart(c: Mapping[str, Any]) -> list[str]:
    points = [(p["x"], p["epsilon"]) for p in c["timeline"]]
    caps = [(cap["limit"], cap["name"]) for cap in c["caps"]]
    return [
        "<h2>Cumulative epsilon</h2>",
        cumulative_chart(points, caps=caps, x_is_time=c["timeline_axis"] == "time"),
        f'<p class="muted">{_esc(c["timeline_note"])}</p>',
    ]


def _not_protected(c: Mapping[str, Any]) -> list[str]:
    items = "".join(f"<li>{_esc(item)}</li>" for item in c["not_protected"])
    return [
        "<h2>What is not protected</h2>",
        f"<p>Differential privacy here covers feature rows only. It does not hide:</p><ul>{items}"
        "</ul>",
    ]


def _accuracy(c: Mapping[str, Any]) -> list[str]:
    out = [
        "<h2>What federating bought: accuracy</h2>",
        "<table><tr><th>session</th><th class=num>test accuracy, federated</th>"
        "<th class=num>this party alone</th><th class=num>gain</th></tr>",
    ]
    for s in c["sessions"]:
        acc = s.get("accuracy") or {}
        fed, alone = acc.get("federated"), acc.get("alone")
        gain = "not recorded"
        if fed is not None and alone is not None:
            gain = f"{100 * (fed - alone):+.1f} points"
        out.append(
            f"<tr><td>{_esc(s['label'] or s['session_id'])}</td>"
            f"<td class=num>{_fmt(fed, 4)}</td><td class=num>{_fmt(alone, 4)}</td>"
            f"<td class=num>{_esc(gain)}</td></tr>"
        )
    out.append("</table>")
    return out


def _verification(c: Mapping[str, Any], signature: Mapping[str, Any] | None) -> list[str]:
    out = ["<h2>Is this file genuine?</h2>"]
    for ledger in c["ledgers"]:
        out.append(
            f"<p>Ledger {_esc(ledger['name'])}: {ledger['releases']} release(s), SHA-256 of its"
            f" rows <code>{_esc(ledger['sha256'])}</code>.</p>"
        )
    if signature is None:
        out.append(
            "<p><b>Not signed.</b> This page is the operator's view, built from the service's"
            " own ledger; each organisation's signed report comes from its own worker's"
            " ledger (<code>glasu report</code>).</p>"
        )
    else:
        out.append(
            f"<p><b>Signed</b> with Ed25519 key <code>{_esc(signature['fingerprint'])}</code>"
            " (the fingerprint of the data owner's report key). Every byte of this file is"
            " covered: run <code>glasu report verify FILE --key OWNER.pub</code>; it says"
            " whether the file was altered and by which key it was signed.</p>"
        )
    return out


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
    scoring = config.get("kind") == "scoring"
    delta = privacy.get("delta") or 0.0
    entries = privacy.get("ledger", [])
    by_kind: dict[str, int] = {}
    for e in entries:
        kind = (
            "scoring"
            if scoring
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
        inverse = 0.0 if z is None else len(entries) / z**2
        who = WHO.get(a.get("key") or "", a["adversary"])
        adversaries.append(
            {
                "key": a.get("key"),
                "adversary": a["adversary"],
                "epsilon": a.get("epsilon"),
                "sentence": sentence(
                    who=who,
                    epsilon=a.get("epsilon"),
                    advantage=None if z is None else advantage(inverse),
                    delta=delta,
                ),
            }
        )
    ledger_z = privacy.get("ledger_noise_multiplier")
    spent = privacy.get("epsilon")
    holds = (
        "one curious partner that does not collude (shared noise)"
        if privacy.get("shared_noise")
        else "all the other partners together, with or without the service"
    )
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
        else [{"name": "session target", "limit": target, "spent": spent or 0.0}],
        "timeline": [{"x": e["release"], "epsilon": e["epsilon"]} for e in entries],
        "timeline_axis": "release",
        "timeline_note": "Epsilon after each release the service counted (its own ledger);"
        " the dashed line is the session's target.",
        "not_protected": privacy.get("not_protected", []),
        "ledgers": [],
        "warnings": warnings,
    }
