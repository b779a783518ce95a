"""`glasu prepare`: an organisation's own tables into its folder. Good input (CSV and Parquet,
streamed in batches) gives the worker's format; every kind of bad input gives one message naming
the file, the row and the column, exit code 1, and leaves nothing behind."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clients.cli.main import main
from models.data import table_file
from models.data.party import read_party

NODES = [
    ["customer", "age", "balance"],
    ["c-7", "31", "1200.5"],
    ["c-2", "45", "-3"],
    ["c-9", "27", "0"],
    ["c-4", "52", "88"],
]
EDGES = [["from", "to"], ["c-7", "c-2"], ["c-2", "c-9"], ["c-9", "c-9"], ["c-2", "c-7"]]
LABELS = [["customer", "fraud"], ["c-7", "0"], ["c-9", "1"]]


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return path


def prepare(
    tmp_path: Path,
    *,
    nodes: list[list[str]] = NODES,
    edges: list[list[str]] = EDGES,
    labels: list[list[str]] | None = LABELS,
    extra: tuple[str, ...] = (),
) -> tuple[int, Path]:
    args = [
        "prepare",
        "--nodes",
        str(write_csv(tmp_path / "nodes.csv", nodes)),
        "--edges",
        str(write_csv(tmp_path / "edges.csv", edges)),
        "--id-column",
        "customer",
        "--out",
        str(tmp_path / "out" / "bank"),
        "--quiet",
        *extra,
    ]
    if labels is not None:
        args += ["--labels", str(write_csv(tmp_path / "labels.csv", labels))]
    return main(args), tmp_path / "out" / "bank"


def test_good_tables_become_the_workers_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, out = prepare(tmp_path)
    assert code == 0
    said = capsys.readouterr().out
    assert (
        "4 nodes, 2 features, 2 undirected edges (1 self-loops and 1 duplicate edges dropped)"
        in said
    )
    assert "2 labelled nodes" in said
    data = read_party(out)
    assert data.ids == ["c-7", "c-2", "c-9", "c-4"]  # the organisation's own ids, row order kept
    assert data.features.dtype == np.float32
    assert data.features.tolist() == [[31, 1200.5], [45, -3], [27, 0], [52, 88]]
    assert data.feature_names == ["age", "balance"]
    assert data.labels.tolist() == [0, -1, 1, -1]
    assert sorted(map(tuple, data.edges.T.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["summary"]["self_loops_dropped"] == 1
    assert meta["summary"]["duplicate_edges_dropped"] == 1
    assert not (out / "alignment.json").exists()  # aligned later
    assert [p.name for p in out.parent.iterdir()] == ["bank"]  # no temporary folder left


def test_parquet_tables_with_integer_ids_stream_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_file, "PARQUET_BATCH_ROWS", 2)
    pq.write_table(
        pa.table({"id": [10, 11, 12, 13, 14], "x": [0.5, 1.0, 1.5, 2.0, 2.5], "flag": [True] * 5}),
        tmp_path / "nodes.parquet",
        row_group_size=2,
    )
    pq.write_table(pa.table({"a": [10, 12, 14], "b": [11, 13, 10]}), tmp_path / "edges.parquet")
    pq.write_table(pa.table({"id": ["14", "10"], "y": [2, 0]}), tmp_path / "labels.parquet")
    code = main(
        [
            "prepare",
            "--nodes", str(tmp_path / "nodes.parquet"),
            "--edges", str(tmp_path / "edges.parquet"),
            "--labels", str(tmp_path / "labels.parquet"),
            "--id-column", "id",
            "--out", str(tmp_path / "out"),
            "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    data = read_party(tmp_path / "out")
    assert data.ids == ["10", "11", "12", "13", "14"]  # integer ids are their decimal text
    assert data.features[:, 1].tolist() == [1.0] * 5
    assert data.labels.tolist() == [0, -1, -1, -1, 2]
    # a bad value in a later batch is named by its row in the whole table
    pq.write_table(
        pa.table({"id": [1, 2, 3, 4, 5], "x": [0.0, 1.0, 2.0, float("inf"), 4.0]}),
        tmp_path / "bad.parquet",
        row_group_size=2,
    )
    code = main(
        ["prepare", "--nodes", str(tmp_path / "bad.parquet"), "--edges",
         str(tmp_path / "edges.parquet"), "--id-column", "id", "--out", str(tmp_path / "bad")]
    )  # fmt: skip
    assert code == 1 and not (tmp_path / "bad").exists()


def test_csv_rows_are_counted_across_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(table_file, "CSV_BLOCK_BYTES", 64)
    nodes = [["customer", "x"]] + [[f"c-{i}", str(i)] for i in range(200)]
    nodes[151][1] = "twelve"
    code, out = prepare(tmp_path, nodes=nodes, labels=None)
    assert code == 1 and not out.exists()
    assert "row 151, column 'x': 'twelve' is not a number" in capsys.readouterr().err


BAD_INPUTS = [
    # (which table, its rows, the file, the row, the column, what the message says)
    (
        "nodes",
        [*NODES, ["c-2", "1", "2"]],
        "nodes.csv",
        5,
        "customer",
        "duplicate id 'c-2' (first at row 2)",
    ),
    ("nodes", [NODES[0], NODES[1], ["c-2", "", "3"]], "nodes.csv", 2, "age", "missing value"),
    (
        "nodes",
        [NODES[0], NODES[1], ["c-2", "4", "lots"]],
        "nodes.csv",
        2,
        "balance",
        "'lots' is not a number",
    ),
    (
        "nodes",
        [NODES[0], ["c-7", "NaN", "1"], NODES[2]],
        "nodes.csv",
        1,
        "age",
        "NaN is not a usable",
    ),
    (
        "nodes",
        [NODES[0], NODES[1], ["c-2", "3", "-inf"]],
        "nodes.csv",
        2,
        "balance",
        "-inf is not a finite",
    ),
    ("nodes", [NODES[0], NODES[1], ["", "3", "4"]], "nodes.csv", 2, "customer", "missing id"),
    ("edges", [*EDGES, ["c-4", "c-99"]], "edges.csv", 5, "to", "unknown id 'c-99'"),
    ("labels", [*LABELS, ["c-5", "1"]], "labels.csv", 3, "customer", "unknown id 'c-5'"),
    ("labels", [*LABELS, ["c-2", "-1"]], "labels.csv", 3, "fraud", "-1 is not a class index"),
    ("labels", [*LABELS, ["c-2", "yes"]], "labels.csv", 3, "fraud", "'yes' is not a class index"),
    ("labels", [*LABELS, ["c-7", "1"]], "labels.csv", 3, "customer", "a second label for id 'c-7'"),
]


@pytest.mark.parametrize(("table", "rows", "file", "row", "column", "says"), BAD_INPUTS)
def test_each_bad_input_names_file_row_and_column(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    table: str,
    rows: list[list[str]],
    file: str,
    row: int,
    column: str,
    says: str,
) -> None:
    code, out = prepare(tmp_path, **{table: rows})
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line
    assert f"{tmp_path / file}: row {row}, column {column!r}: {says}" in err
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no partial folder


@pytest.mark.parametrize(
    ("table", "rows", "file", "says"),
    [
        ("nodes", [NODES[0]], "nodes.csv", "the table has no rows"),
        ("edges", [EDGES[0]], "edges.csv", "the table has no rows"),
        ("labels", [LABELS[0]], "labels.csv", "the table has no rows"),
        ("nodes", [["customer"], ["c-1"]], "nodes.csv", "no feature column"),
        ("nodes", [["id", "age"], ["c-1", "3"]], "nodes.csv", "no column 'customer' (--id-column)"),
        ("edges", [["a", "b", "w"], ["c-7", "c-2", "1"]], "edges.csv", "--edge-columns"),
    ],
)
def test_tables_without_rows_or_columns_name_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    table: str,
    rows: list[list[str]],
    file: str,
    says: str,
) -> None:
    code, out = prepare(tmp_path, **{table: rows})
    err = capsys.readouterr().err
    assert code == 1 and f"{tmp_path / file}: " in err and says in err, err
    assert not out.exists()


def test_edge_columns_can_be_named_and_out_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    edges = [["to", "weight", "from"], ["c-7", "1", "c-2"]]
    code, out = prepare(tmp_path, edges=edges, extra=("--edge-columns", "from,to"))
    assert code == 0 and read_party(out).summary["undirected_edges"] == 1
    code, _ = prepare(tmp_path)
    assert code == 2 and "exists" in capsys.readouterr().err


def test_a_failure_while_writing_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import models.data.party_tables

    def write_half(tables: object, folder: Path, **options: object) -> dict:
        (folder / "features.npy").write_bytes(b"half")
        raise OSError(28, "No space left on device", str(folder / "edges.npy"))

    monkeypatch.setattr(models.data.party_tables, "write_party_tables", write_half)
    code, out = prepare(tmp_path)
    assert code == 1 and "No space left on device" in capsys.readouterr().err
    assert not out.exists() and not any(out.parent.iterdir())


@pytest.mark.parametrize("block_bytes", [None, 64])  # one block, and a bad row in a later one
def test_a_row_with_too_many_fields_is_named(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    block_bytes: int | None,
) -> None:
    if block_bytes is not None:
        monkeypatch.setattr(table_file, "CSV_BLOCK_BYTES", block_bytes)
    nodes = [NODES[0]] + [[f"c-{i}", "1", "2"] for i in range(40)]
    nodes[33] = ["c-32", "1", "2", "3"]
    code, out = prepare(tmp_path, nodes=nodes, labels=None)
    err = capsys.readouterr().err
    assert code == 1 and not out.exists(), err
    assert err.count("\n") == 1, err
    assert f"{tmp_path / 'nodes.csv'}: row 33: 4 fields where the header has 3" in err


def test_a_semicolon_separated_table_gets_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    semicolons = tmp_path / "nodes.csv"
    semicolons.write_text("customer;age;balance\nc-7;31;1200.5\n")
    code = main(["prepare", "--nodes", str(semicolons), "--edges",
                 str(write_csv(tmp_path / "edges.csv", EDGES)), "--id-column", "customer",
                 "--out", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{semicolons}: its header 'customer;age;balance' seems separated by semicolons" in err
    assert "comma-separated" in err


@pytest.mark.parametrize(
    ("table", "what"), [("nodes", "node"), ("edges", "edge"), ("labels", "label")]
)
def test_an_empty_file_names_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture, table: str, what: str
) -> None:
    paths = {
        "nodes": write_csv(tmp_path / "nodes.csv", NODES),
        "edges": write_csv(tmp_path / "edges.csv", EDGES),
        "labels": write_csv(tmp_path / "labels.csv", LABELS),
    }
    paths[table].write_bytes(b"")
    code = main(["prepare", "--nodes", str(paths["nodes"]), "--edges", str(paths["edges"]),
                 "--labels", str(paths["labels"]), "--id-column", "customer",
                 "--out", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{paths[table]}: the {what} table is an empty file (0 bytes)" in err


def test_a_wrong_id_column_of_a_wide_table_names_the_closest_and_the_count(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Not all 479 names on one line: the closest few, and how many there are."""
    header = ["customer_id", *(f"feature_{c}" for c in range(478))]
    nodes = [header, ["c-1", *("1" for _ in range(478))]]
    code, _ = prepare(tmp_path, nodes=nodes, labels=None)  # --id-column customer
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.rstrip().endswith(
        "no column 'customer' (--id-column); the closest of its 479 columns: customer_id"
    )
    (tmp_path / "other").mkdir()
    nodes = [["x", *header[1:]], nodes[1]]  # nothing like it: the first few
    code, _ = prepare(tmp_path / "other", nodes=nodes, labels=None)
    err = capsys.readouterr().err
    assert code == 1 and err.count("feature_") == 2, err
    assert err.rstrip().endswith("its 479 columns begin with x, feature_0, feature_1, ...")


def test_the_progress_bars_count_a_csv_files_bytes_and_a_parquet_files_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Totals known from the start (the file's size, the Parquet row count), no "0.00 rows"."""
    counted: dict[str, tuple[float, float | None]] = {}

    class Counted(table_file.tqdm):  # type: ignore[misc,name-defined]
        def close(self) -> None:
            counted.setdefault(self.desc, (self.n, self.total))
            super().close()

    monkeypatch.setattr(table_file, "tqdm", Counted)
    monkeypatch.setattr(table_file, "CSV_BLOCK_BYTES", 64)  # many blocks
    nodes = write_csv(
        tmp_path / "nodes.csv", [["customer", "x"]] + [[f"c-{i}", "1"] for i in range(300)]
    )
    source = table_file.TableFile(nodes, True, what="node table")
    assert sum(batch.num_rows for _, batch in source.batches()) == 300
    parquet = tmp_path / "nodes.parquet"
    pq.write_table(
        pa.table({"customer": [f"c-{i}" for i in range(300)], "x": [1.0] * 300}), parquet
    )
    source = table_file.TableFile(parquet, True, what="node table")
    assert sum(batch.num_rows for _, batch in source.batches()) == 300
    size = nodes.stat().st_size
    assert counted == {"nodes.csv": (size, size), "nodes.parquet": (300, 300)}
    assert "0.00" not in capsys.readouterr().err
