"""docs/data.md's commands are real: every `glasu ...` line of its shell blocks parses with the
command line as it is."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from clients.cli.main import build_parser

DOC = Path(__file__).resolve().parents[3] / "docs" / "data.md"


def invocations(text: str) -> list[list[str]]:
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            if line.strip().startswith("glasu "):
                line = re.sub(r'"\$\(cat [^)]*\)"', "ID", line)
                found.append(shlex.split(line)[1:])
    return found


def test_every_glasu_command_in_the_data_guide_parses() -> None:
    commands = invocations(DOC.read_text())
    names = {argv[0] for argv in commands}
    assert {"prepare", "train", "align", "session", "worker", "model", "score"} <= names
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)
