"""The answering party's side of an online scoring session (docs/data.md, "Online scoring"):
its own ids to the aligned nodes of its kept alignment (an id it lacks, or that is not shared,
refused by name before anything is asked), the request (``SessionClient.ask``), and the
answer its own worker writes (``glasu worker --online --predictions DIR``), in the asked order.
The answer never leaves the answering party: the service only learns which aligned nodes were
asked, as in a batch scoring session."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from clients.session_client import SessionClient
from models.data.party import NOT_SHARED, read_alignment, read_ids, read_meta
from secure.wire.request_signature import RequestSignature


class UnknownIds(ValueError):
    """Asked ids the party's kept alignment does not map to a shared node."""

    def __init__(self, ids: Sequence[str]) -> None:
        shown = ", ".join(repr(i) for i in ids[:10]) + (" ..." if len(ids) > 10 else "")
        super().__init__(
            f"{len(ids)} id(s) not in this party's aligned nodes, nothing asked: {shown} "
            "(new customers are aligned first: `glasu align run`)"
        )
        self.ids = list(ids)


def aligned_nodes_of(folder: Path, ids: Sequence[str]) -> np.ndarray:
    """The aligned node of each of ``ids`` (the party's own), in their order; :class:`UnknownIds`
    naming every id that is not in the folder or not shared."""
    folder = Path(folder)
    alignment = read_alignment(folder, rows=int(read_meta(folder)["num_rows"]))
    if alignment is None:
        raise ValueError(f"{folder} is not aligned: run `glasu align run` first")
    rows = pc.index_in(pa.array(list(ids), pa.string()), value_set=read_ids(folder))
    row_of = rows.to_numpy(zero_copy_only=False)
    known = ~np.asarray(rows.is_null())
    nodes = np.full(len(ids), NOT_SHARED, dtype=np.int64)
    nodes[known] = alignment.rows[row_of[known].astype(np.int64)]
    unknown = [ids[i] for i in np.flatnonzero(nodes == NOT_SHARED)]
    if unknown:
        raise UnknownIds(unknown)
    return nodes


@dataclass(frozen=True)
class Answer:
    request_session: str
    table: pa.Table  # the answering worker's rows, in the asked order


def ask(
    online: SessionClient,
    nodes: np.ndarray,
    ids: Sequence[str],
    *,
    predictions: Path,
    wait_seconds: float,
    sleep: Callable[[float], None],
    signature: RequestSignature | None = None,
) -> Answer:
    """Ask for ``nodes`` (``ids`` in the same order), signed by ``signature``, and wait for the
    answer file the answering worker writes into ``predictions``; :class:`RequestFailed` when
    the request session ends without one (a party refused it: its reason), TimeoutError after
    ``wait_seconds``."""
    opened = online.ask(np.unique(nodes), signature)
    path = Path(predictions) / f"{opened.session_id}.csv"
    waited = 0.0
    while not path.exists():
        status = online.request_session(opened.session_id)
        if status is not None and status.state not in ("running", "finished"):
            reason = online.refusal(opened.session_id)
            raise RequestFailed(opened.session_id, status.state, reason)
        if waited >= wait_seconds:
            raise TimeoutError(
                f"no answer to {opened.session_id} in {wait_seconds:.0f} s: is the answering "
                f"party's `glasu worker --online --predictions {predictions}` running?"
            )
        sleep(POLL_SECONDS)
        waited += POLL_SECONDS
    table = pa_csv.read_csv(path, convert_options=pa_csv.ConvertOptions(
        column_types={"id": pa.string()}))  # fmt: skip
    order = pc.index_in(pa.array(list(ids), pa.string()), value_set=table.column("id"))
    return Answer(request_session=opened.session_id, table=table.take(order))


POLL_SECONDS = 0.02


class RequestFailed(RuntimeError):
    def __init__(self, session_id: str, state: str, reason: str | None) -> None:
        super().__init__(
            f"request {session_id} was not answered ({state}): {reason or 'no reason given'}"
        )
        self.reason = reason
