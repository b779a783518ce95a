"""The privacy report's page for a compliance officer (secure/report_html.py, secure/report.py):
a chart whose time ticks tell the releases apart and stay inside it, and caps said as sentences
(what was spent of which cap, what is left)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from secure.report import cap_figure
from secure.report_html import cumulative_chart


def _ticks(svg: str) -> list[tuple[str, str]]:
    """(anchor, label) of each x tick, left to right."""
    below = r'y="272" text-anchor="(start|middle|end)" font-size="11">([^<]+)</text>'
    return re.findall(below, svg)  # the default chart's plot ends at 256: ticks at 256 + 16


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_releases_within_minutes_get_times_of_day_and_the_date_once() -> None:
    start = _epoch("2026-11-29T15:14:00")
    svg = cumulative_chart([(start, 0.1), (start + 50, 0.2)], caps=[(4.0, "cap")], x_is_time=True)
    assert _ticks(svg) == [("start", "15:14:00"), ("middle", "15:14:25"), ("end", "15:14:50")]
    assert "time (UTC) on 2026-11-29" in svg


def test_releases_over_days_get_dates_and_one_release_no_repeated_tick() -> None:
    start = _epoch("2026-11-01T09:00:00")
    svg = cumulative_chart([(start, 0.1), (start + 10 * 86400, 0.3)], caps=[], x_is_time=True)
    assert _ticks(svg) == [("start", "2026-11-01"), ("middle", "2026-11-06"), ("end", "2026-11-11")]
    one = cumulative_chart([(start, 0.1)], caps=[], x_is_time=True)
    labels = [label for _, label in _ticks(one)]
    assert len(labels) == len(set(labels))
    by_release = cumulative_chart([(1, 0.1), (2, 0.2)], caps=[], x_is_time=False)
    assert [label for _, label in _ticks(by_release)] == ["1", "2"]


def test_caps_are_sentences_an_officer_reads() -> None:
    lifetime = cap_figure("lifetime cap", limit=8.0, spent=0.5)
    assert lifetime["sentence"] == "Spent epsilon 0.5 of the lifetime cap of 8, 7.5 left."
    assert lifetime["left"] == 7.5
    per_session = cap_figure(
        "per-session cap (largest session)", limit=4.0, spent=0.00169, largest_session=True
    )
    assert per_session["sentence"] == (
        "The largest session spent epsilon 0.00169 of the cap of 4 per session, 3.998 left; "
        "each new session may spend up to 4."
    )
    assert cap_figure("session target", limit=2.0, spent=3.0)["left"] == 0.0
