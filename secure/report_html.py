"""The privacy report people read: one self-contained HTML page (inline CSS, inline SVG chart,
no script that runs, nothing fetched) of a report's content (``secure/report.py``), the same
sections and wording for an organisation's ledgers and for one session. Torch-free and
matplotlib-free: the service imports it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from secure.report import KINDS

#: The signature's place in an HTML report: this slot is signed, then replaced by the signature.
SIGNATURE_SLOT = "0" * 128
DATA_ELEMENT = "glasu-report-data"
SIGNATURE_ELEMENT = "glasu-signature"
GROUP_NOTE = (
    "This figure is for a larger unit than the one the caps and the target protect: the same"
    " node's rows at every organisation changing together (like protecting a group instead of"
    " one person). The target applies to one organisation's row, so this figure can be above it"
    " without any budget being overspent; it is stated so that nobody mistakes the one for the"
    " other."
)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "not recorded" if value is None else f"{value:.{digits}g}"


def _epsilon_cell(value: float | None) -> str:
    return "none: sees no release" if value is None else f"{value:.3g}"


def _names(values: Sequence[str] | None) -> str:
    return ", ".join(values) if values else "not recorded"


def _esc(value: Any) -> str:
    return html.escape("not recorded" if value is None else str(value), quote=True)


#: Outside strings JSON has none of these characters, so escaping them everywhere keeps the JSON
#: valid (``\u003c`` is ``<`` to a JSON parser) and leaves nothing that could end a ``<script>``
#: element or open a comment in it (``</script>``, ``<!--``).
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def embedded_json(content: Mapping[str, Any]) -> str:
    """JSON that cannot end its ``<script>`` element early, and parses back to ``content``."""
    text = json.dumps(content, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False)
    return text.translate(_SCRIPT_SAFE)


def _table(header: str, rows: Iterable[str]) -> list[str]:
    """A table: ``header`` its heading cells, each of ``rows`` one row's cells (HTML)."""
    return [f"<table><tr>{header}</tr>", *(f"<tr>{row}</tr>" for row in rows), "</table>"]


def _adversary_cells(a: Mapping[str, Any]) -> str:
    note = f"<br><i>{_esc(GROUP_NOTE)}</i>" if a["key"] == "group" else ""
    return (
        f"<td>{_esc(a['adversary'])}</td><td class=num>{_epsilon_cell(a['epsilon'])}</td>"
        f"<td>{_esc(a['sentence'])}{note}</td>"
    )


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
    ticks, axis = _time_ticks(x0, x1) if x_is_time else _release_ticks(x0, x1)
    for i, (x, label) in enumerate(ticks):
        # the first and the last label stay inside the chart
        anchor = "start" if i == 0 else "end" if i == len(ticks) - 1 else "middle"
        parts.append(
            f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="{anchor}"'
            f' font-size="11">{_esc(label)}</text>'
        )
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


def _time_ticks(x0: float, x1: float) -> tuple[list[tuple[float, str]], str]:
    """Three ticks from ``x0`` to ``x1`` (epoch seconds) with labels that tell them apart: the
    time of day when every release fell on one day (the date goes in the axis title), else the
    date, with the time within a few days; and the axis title."""
    first, last = (datetime.fromtimestamp(x, UTC) for x in (x0, x1))
    if first.date() == last.date():
        form = "%H:%M:%S" if x1 - x0 < 600 else "%H:%M"
        axis = f"time (UTC) on {first:%Y-%m-%d}"
    else:
        form = "%Y-%m-%d %H:%M" if x1 - x0 < 3 * 86400 else "%Y-%m-%d"
        axis = "time (UTC)"
    return _distinct_ticks(x0, x1, lambda x: datetime.fromtimestamp(x, UTC).strftime(form)), axis


def _release_ticks(x0: float, x1: float) -> tuple[list[tuple[float, str]], str]:
    return _distinct_ticks(x0, x1, lambda x: f"{x:.0f}"), "release"


def _distinct_ticks(x0: float, x1: float, label: Callable[[float], str]) -> list[tuple[float, str]]:
    """Ticks at the start, the middle and the end, each label once (a short span can give two
    ticks one label)."""
    ticks: list[tuple[float, str]] = []
    for i in range(3):
        x = x0 + (x1 - x0) * i / 2
        text = label(x)
        if all(text != seen for _, seen in ticks):
            ticks.append((x, text))
    return ticks


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
        f"<li><b>Spent:</b> epsilon {_fmt(total['epsilon'], 4)} at delta {c['delta']:g}"
        f" ({_esc(total['holds_against'])}).</li>",
    ]
    if total.get("predictions_shared"):
        lines.append(
            f"<li><b>Predictions shared:</b> {total['predictions_shared']} of this"
            " organisation's predictions went to its partners, as its owner agreed (a disclosure"
            " of the model's answers, not a noisy release: no epsilon).</li>"
        )
    for cap in c["caps"]:
        lines.append(f"<li><b>Budget:</b> {_esc(cap['sentence'])}</li>")
    if not c["caps"]:
        lines.append("<li><b>Budget:</b> no cap was set for this report.</li>")
    lines.append(f"<li>{_esc(total['sentence'])}</li></ul></div>")
    if c.get("warnings"):
        lines += [f'<p class="warn">{_esc(w)}</p>' for w in c["warnings"]]
    return lines


def _kinds(by_kind: Mapping[str, int]) -> str:
    parts = [f"{by_kind.get(k, 0)} {k}" for k in KINDS if by_kind.get(k)]
    if by_kind.get("not recorded"):
        parts.append(f"{by_kind['not recorded']} of a kind not recorded (older ledger)")
    return ", ".join(parts) or "none"


def _predictions_shared(session: Mapping[str, Any]) -> str:
    shared = session.get("predictions_shared")
    return f"; {shared} prediction(s) shared with the partners" if shared else ""


def _who_and_when(c: Mapping[str, Any]) -> list[str]:
    rows = (
        f"<td>{_esc(s['label'] or 'no label')}<br><code class=muted>"
        f"{_esc(s['session_id'])}</code></td><td>{_esc(_names(s['partners']))}</td>"
        f"<td>{_esc(s['operator'])}</td><td>{_esc(s['kind'])}</td>"
        f"<td>{_esc(s['created_at'])}</td>"
        f"<td>{_esc(s['first_release_at'])} to {_esc(s['last_release_at'])}</td>"
        f'<td class="num">{s["releases"]}: {_esc(_kinds(s["by_kind"]))}'
        f"{_esc(_predictions_shared(s))}</td>"
        f"<td>{_esc(s.get('shares') or '')}</td>"
        for s in c["sessions"]
    )
    return [
        "<h2>Sessions: with whom, when, what was released</h2>",
        *_table(
            "<th>session</th><th>partners</th><th>operator</th><th>kind</th>"
            "<th>created (UTC)</th><th>releases (UTC)</th><th>released</th>"
            "<th>who could read a share</th>",
            rows,
        ),
    ]


def _spent(c: Mapping[str, Any], delta: float) -> list[str]:
    out = [
        "<h2>Budget spent, and against whom it holds</h2>",
        f"<p>What is protected: {_esc(c['privacy_unit'])}. Epsilon is stated at delta"
        f" {delta:g} with the {_esc(c['accountant'])} accountant; a smaller epsilon is a"
        " stronger guarantee.</p>",
        *_table(
            "<th>session</th><th>against</th><th class=num>epsilon</th><th>in plain words</th>",
            (
                f"<td>{_esc(s['label'] or s['session_id'])}</td>{_adversary_cells(a)}"
                for s in c["sessions"]
                for a in s["adversaries"]
            ),
        ),
    ]
    if len(c["sessions"]) > 1 or c["scope"] == "organisation":
        out.append("<h3>In total, over every session</h3>")
        out += _table(
            "<th>against</th><th class=num>epsilon</th><th>in plain words</th>",
            (_adversary_cells(a) for a in c["adversaries"]),
        )
    if c["caps"]:
        out.append("<h3>Budget left</h3>")
        out += _table(
            "<th>cap</th><th class=num>limit</th><th class=num>spent</th><th class=num>left</th>",
            (
                f"<td>{_esc(cap['name'])}</td><td class=num>{cap['limit']:g}</td>"
                f"<td class=num>{_fmt(cap['spent'])}</td>"
                f"<td class=num>{cap['left']:.3g}</td>"
                for cap in c["caps"]
            ),
        )
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
    return [
        "<h2>What federating bought: accuracy</h2>",
        *_table(
            "<th>session</th><th class=num>test accuracy, federated</th>"
            "<th class=num>this party alone</th><th class=num>gain</th>",
            (_accuracy_cells(s) for s in c["sessions"]),
        ),
    ]


def _accuracy_cells(s: Mapping[str, Any]) -> str:
    acc = s.get("accuracy") or {}
    fed, alone = acc.get("federated"), acc.get("alone")
    gain = "not recorded"
    if fed is not None and alone is not None:
        gain = f"{100 * (fed - alone):+.1f} points"
    return (
        f"<td>{_esc(s['label'] or s['session_id'])}</td>"
        f"<td class=num>{_fmt(fed, 4)}</td><td class=num>{_fmt(alone, 4)}</td>"
        f"<td class=num>{_esc(gain)}</td>"
    )


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
