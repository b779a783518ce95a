"""Write one named section of docs/results.md, leaving the other benchmarks' sections alone."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
HEADER = (
    "# Results\n\nEvery table below is written by a script in `bench/` from runs on this "
    "project's code; each section names its script, the machine and the settings.\n"
)


def write_section(name: str, markdown: str, *, path: Path = RESULTS) -> None:
    text = path.read_text() if path.exists() else HEADER
    begin, end = f"<!-- begin:{name} -->", f"<!-- end:{name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def mean_std(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "-"
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"
