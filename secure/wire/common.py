"""What every JSON body of the wire shares: the service's limits, the strict base of request
bodies, the base of response bodies, and the health answer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_CLIENTS = 64
MAX_LAYERS = 16
MAX_WIDTH = 4096
MAX_ROUNDS = 100_000
MAX_NODE_ID = 2**62
MAX_COUNT = 2**31 - 1  # bound for counts that have no natural limit (Q, fanout, batch size)
MAX_LABEL = 200  # characters of a session's or an alignment's free-text label


def _without_nul(label: str) -> str:
    # PostgreSQL's text cannot hold NUL; refused on every database alike
    if "\x00" in label:
        raise ValueError("a label cannot hold NUL (U+0000)")
    return label


#: A session's or an alignment's free-text label: any text of up to MAX_LABEL characters but NUL.
Label = Annotated[str, Field(max_length=MAX_LABEL), AfterValidator(_without_nul)]


class StrictModel(BaseModel):
    """A request body: unknown fields and coercions are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ResponseModel(BaseModel):
    """A response body. The client parses it leniently (fields a newer service adds are
    ignored); a field whose JSON name is a Python keyword (``pass``) is built by its Python
    name on the service's side and read by its JSON name on the client's."""

    model_config = ConfigDict(populate_by_name=True)


class Health(ResponseModel):
    status: Literal["ok"]
    encryption: bool = Field(description="Whether a CKKS public context is loaded.")
    max_body_bytes: int | None = Field(
        None,
        description="The largest request body the service takes (GLASU_MAX_BODY_BYTES): it "
        "sizes the parts of its sessions and alignments to it (null: an older service).",
    )


class Waiting(ResponseModel):
    """A long poll's 202 answer: not there yet, and who still owes it."""

    status: Literal["waiting"] = "waiting"
    missing: list[int] = Field(description="The parties that still owe what this answer needs.")
