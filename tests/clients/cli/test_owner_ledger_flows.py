"""The owner's ledger belongs to the organisation, not to a copy of its data: the one-machine
flows of docs/data.md run as a user runs them (real `glasu` processes: `glasu prepare`,
`glasu train --party`, the current tables prepared again into a new folder, `glasu score`,
`glasu budget --local`, `glasu report --local`) count every release in one ledger per
organisation, its lifetime cap refuses a scoring once reached, and a ledger an older glasu
kept beside the data is used or refused by name, never silently left behind."""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger

Glasu = Callable[..., subprocess.CompletedProcess[str]]
PARTIES = ("bank", "insurer")
NODES = 90  # per party; 80 shared
NEW_CUSTOMERS = 6
# gcnii: a design whose every pass is a release, scorings included (the default under DP, the
# private sign design, scores for nothing: tests/clients/cli/test_score_private_sign.py)
TRAINING = (
    "--backbone", "gcnii", "--rounds", "2", "--eval-every", "2", "--batch-size", "16",
    "--hidden", "8", "--epsilon", "2", "--no-he", "--quiet",
)  # fmt: skip


def ledgers_folder() -> Path:
    """Where the organisations' ledgers go by default (tests/conftest.py sets XDG_DATA_HOME)."""
    return Path(os.environ["XDG_DATA_HOME"]) / "glasu" / "ledgers"


def write_tables(root: Path, *, new_customers: int = 0) -> None:
    """Two organisations' tables (CSV): 80 shared customers and 10 of each party's own, a few
    features and a ring of edges each, labels at the bank; ``new_customers`` more, shared."""
    rng = np.random.default_rng(7)
    shared = [f"c-{i:03d}" for i in range(80)]
    classes = rng.integers(2, size=80 + new_customers)
    for m, party in enumerate(PARTIES):
        ids = shared + [f"{party}-{i}" for i in range(NODES - 80)]
        ids += [f"new-{i}" for i in range(new_customers)]
        folder = root / party
        folder.mkdir(parents=True)
        with (folder / "nodes.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["customer", *[f"{party}_f{c}" for c in range(3 + m)]])
            for row, node in enumerate(ids):
                signal = classes[row] if row < 80 else 0
                writer.writerow([node, *(rng.normal(signal, 1.0, size=3 + m).round(3))])
        with (folder / "edges.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["from", "to"])
            for row in range(len(ids)):
                writer.writerow([ids[row], ids[(row + 1 + m) % len(ids)]])
        if party == "bank":
            with (folder / "labels.csv").open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["customer", "class"])
                for row in range(80):
                    writer.writerow([shared[row], int(classes[row])])


def prepare(glasu: Glasu | None, tables: Path, out: Path) -> list[Path]:
    """``glasu prepare`` of every party's tables, in a process of its own (``glasu``) or, where
    it only sets a test up, in this one."""
    folders = []
    for party in PARTIES:
        args = ["prepare", "--nodes", str(tables / party / "nodes.csv"), "--edges",
                str(tables / party / "edges.csv"), "--id-column", "customer", "--quiet",
                "--out", str(out / party)]  # fmt: skip
        if (tables / party / "labels.csv").exists():
            args += ["--labels", str(tables / party / "labels.csv")]
        if glasu is None:
            assert main(args) == 0
        else:
            done = glasu(*args)
            assert done.returncode == 0, done.stderr
        folders.append(out / party)
    return folders


def parties(folders: list[Path]) -> list[str]:
    return [arg for folder in folders for arg in ("--party", str(folder))]


def budget(glasu: Glasu, *where: str) -> dict:
    done = glasu("budget", *where, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow  # three real federations (a training and two scorings), each 3 processes
def test_training_and_scoring_of_copies_count_in_one_ledger_under_one_lifetime_cap(
    tmp_path: Path, glasu: Glasu
) -> None:
    write_tables(tmp_path / "tables")
    write_tables(tmp_path / "tables-now", new_customers=NEW_CUSTOMERS)
    prepared = prepare(glasu, tmp_path / "tables", tmp_path / "prepared")
    models = tmp_path / "models"
    done = glasu("train", *parties(prepared), *TRAINING, "--model-dir", str(models), timeout=300)
    assert done.returncode == 0, done.stderr
    trained = budget(glasu, "--local", str(prepared[0]))
    bank_ledger = ledgers_folder() / "bank.sqlite3"
    assert Path(trained["ledger"]) == bank_ledger and bank_ledger.is_file()
    assert len(trained["sessions"]) == 1 and trained["epsilon"] <= 2.0 + 1e-9
    manifest = json.loads((models / "bank" / "manifest.json").read_text())
    assert str(bank_ledger.resolve()) in manifest["privacy"]["source"]  # the ledger that stays

    # docs/data.md, "Score jointly": the current tables prepared again, into new folders
    current = prepare(glasu, tmp_path / "tables-now", tmp_path / "current")
    out = tmp_path / "predictions"
    done = glasu("score", *parties(current), "--model-dir", str(models), "--out", str(out),
                 "--no-he", "--quiet", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    scored = budget(glasu, "--local", str(current[0]))
    assert scored["ledger"] == trained["ledger"]  # the copy counts in the organisation's ledger
    assert budget(glasu, "--local", str(prepared[0])) == scored
    assert budget(glasu, "--ledger", str(bank_ledger)) == scored
    assert scored["sessions"][0]["session"] == trained["sessions"][0]["session"]
    assert len(scored["sessions"]) == 2 and scored["releases"] > trained["releases"]
    assert scored["epsilon"] > trained["epsilon"]
    insurer = budget(glasu, "--local", str(current[1]))
    assert Path(insurer["ledger"]) == ledgers_folder() / "insurer.sqlite3"
    assert len(insurer["sessions"]) == 2

    keys = tmp_path / "keys"
    assert glasu("report", "keygen", "--out", str(keys)).returncode == 0
    report_file = tmp_path / "report.json"
    done = glasu("report", "--local", str(prepared[0]), str(current[0]), "--out",
                 str(report_file), "--signing-key", str(keys / "report-signing.key"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(report_file.read_text())["report"]
    assert report["total"]["releases"] == scored["releases"]  # one ledger, counted once
    assert report["total"]["epsilon"] == pytest.approx(scored["epsilon"], rel=1e-9)

    # the lifetime cap counts the training and the scoring: a scoring past it is refused
    cap = f"{scored['epsilon'] + 0.01:.6f}"
    done = glasu("score", *parties(current), "--model-dir", str(models), "--out",
                 str(tmp_path / "again"), "--no-he", "--quiet", "--max-lifetime-epsilon", cap,
                 timeout=300)  # fmt: skip
    assert done.returncode != 0
    assert "lifetime spend" in done.stderr and "privacy policy" in done.stderr
    assert budget(glasu, "--local", str(prepared[0]))["releases"] == scored["releases"]


def test_prepare_names_the_organisation_and_its_ledger(tmp_path: Path, glasu: Glasu) -> None:
    write_tables(tmp_path / "tables")
    source = tmp_path / "tables" / "bank"
    done = glasu("prepare", "--nodes", str(source / "nodes.csv"), "--edges",
                 str(source / "edges.csv"), "--id-column", "customer", "--quiet",
                 "--organisation", "First-Bank", "--out", str(tmp_path / "x"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "x" / "meta.json").read_text())
    assert meta["organisation"] == "First-Bank"
    assert str(ledgers_folder() / "First-Bank.sqlite3") in done.stdout
    done = glasu("prepare", "--nodes", str(source / "nodes.csv"), "--edges",
                 str(source / "edges.csv"), "--id-column", "customer",
                 "--organisation", "../etc", "--out", str(tmp_path / "y"))  # fmt: skip
    assert done.returncode == 2 and "cannot name an organisation" in done.stderr
    assert not (tmp_path / "y").exists()


def _old_ledger(folder: Path) -> None:
    """A ledger as an older glasu kept it, beside the data, with one release."""
    with OwnerLedger(folder / LEDGER_FILENAME) as ledger:
        ledger.record(session_id="s-old", pass_index=0, noise_multiplier=2.0)


def test_an_older_ledger_beside_the_data_is_used_or_refused_by_name(
    tmp_path: Path, glasu: Glasu
) -> None:
    write_tables(tmp_path / "tables")
    folders = prepare(None, tmp_path / "tables", tmp_path / "prepared")
    bank = folders[0]
    _old_ledger(bank)
    # a folder of this glasu names its organisation: the older ledger would stop counting
    token = tmp_path / "client-0.token"
    token.write_text("t" * 32)
    worker = ("worker", "--server", "http://127.0.0.1:9", "--session", "s-new", "--client", "0",
              "--token-file", str(token), "--data", str(bank), "--device", "cpu")  # fmt: skip
    for argv in (("budget", "--local", str(bank)), ("train", *parties(folders), *TRAINING), worker):
        done = glasu(*argv, timeout=120)
        assert done.returncode == 1, done.stderr
        assert f"mv {bank / LEDGER_FILENAME} {ledgers_folder() / 'bank.sqlite3'}" in done.stderr
    assert not (ledgers_folder() / "bank.sqlite3").exists()  # nothing written meanwhile
    # moved as the message says, it keeps counting
    ledgers_folder().mkdir(parents=True)
    (bank / LEDGER_FILENAME).rename(ledgers_folder() / "bank.sqlite3")
    assert budget(glasu, "--local", str(bank))["sessions"][0]["session"] == "s-old"
    # a folder of an older glasu prepare (no organisation) keeps its ledger beside the data
    meta = json.loads((folders[1] / "meta.json").read_text())
    del meta["organisation"]
    (folders[1] / "meta.json").write_text(json.dumps(meta))
    _old_ledger(folders[1])
    shown = budget(glasu, "--local", str(folders[1]))
    assert shown["ledger"] == str(folders[1] / LEDGER_FILENAME) and shown["releases"] == 1


def test_two_folders_of_one_organisation_are_one_party(tmp_path: Path, glasu: Glasu) -> None:
    write_tables(tmp_path / "tables")
    first = prepare(None, tmp_path / "tables", tmp_path / "a")
    second = prepare(None, tmp_path / "tables", tmp_path / "b")
    done = glasu("train", "--party", str(first[0]), "--party", str(second[0]), *TRAINING)
    assert done.returncode == 1
    assert "one privacy ledger" in done.stderr and "--organisation" in done.stderr


def test_a_party_ledger_is_given_once_per_party(tmp_path: Path, glasu: Glasu) -> None:
    write_tables(tmp_path / "tables")
    folders = prepare(None, tmp_path / "tables", tmp_path / "prepared")
    done = glasu("train", *parties(folders), "--ledger", str(tmp_path / "l.sqlite3"), *TRAINING)
    assert done.returncode == 2 and "once per --party" in done.stderr
    done = glasu("train", "--dataset", "cora", "--ledger", str(tmp_path / "l.sqlite3"))
    assert done.returncode == 2 and "run's own folder" in done.stderr


@pytest.mark.slow  # a real federation (service and two workers)
def test_an_explicit_ledger_is_the_one_written(tmp_path: Path, glasu: Glasu) -> None:
    """`--ledger` per party: the organisations' releases go there, not to the default."""
    write_tables(tmp_path / "tables")
    folders = prepare(glasu, tmp_path / "tables", tmp_path / "prepared")
    chosen = [tmp_path / "vault" / f"{party}.db" for party in PARTIES]
    done = glasu("train", *parties(folders), *TRAINING,
                 *[a for path in chosen for a in ("--ledger", str(path))], timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for path in chosen:
        with sqlite3.connect(path) as connection:
            assert connection.execute("SELECT COUNT(*) FROM releases").fetchone()[0] > 0
    assert not ledgers_folder().exists()


def test_a_run_past_the_lifetime_cap_or_with_no_ledger_to_write_is_refused_at_once(
    tmp_path: Path, glasu: Glasu
) -> None:
    write_tables(tmp_path / "tables")
    folders = prepare(None, tmp_path / "tables", tmp_path / "prepared")
    done = glasu("train", *parties(folders), "--epsilon", "20", "--no-he", "--quiet")
    assert done.returncode == 2 and "over --max-lifetime-epsilon 16" in done.stderr
    ledgers = [a for folder in folders for a in ("--ledger", str(folder / "l.sqlite3"))]
    done = glasu("train", *parties(folders), "--transport", "inprocess", *ledgers, "--quiet")
    assert done.returncode == 2 and "writes no ledger" in done.stderr
