"""docs/data.md's commands are real: every `glasu ...` line of its shell blocks parses with the
command line as it is."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from clients.cli import session_cmd
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


def test_the_deployed_example_names_the_label_holder_its_unlabelled_party_needs() -> None:
    """A party prepared without --labels cannot train against labels: followed as written, the
    example's session must name a label holder (and pass the checks across options)."""
    commands = invocations(DOC.read_text())
    assert any(argv[0] == "prepare" and "--labels" not in argv for argv in commands)
    creates = [argv for argv in commands if argv[:2] == ["session", "create"]]
    assert creates
    parser = build_parser()
    for argv in creates:
        args = parser.parse_args(argv)
        # a scoring session takes the label holder of the training it scores with
        assert args.label_holder is not None or args.score_with is not None, argv
        session_cmd.check(args)
