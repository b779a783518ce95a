"""Signed privacy reports: an Ed25519 signature (PyNaCl) by the data owner's report key over
every byte of the HTML report (its signature value left as
:data:`secure.report_html.SIGNATURE_SLOT`), or over the canonical JSON of a JSON report's
content.

Anyone can sign a report with a key of their own, so a valid signature says "not altered since
the holder of key F signed it"; whether F is the owner's key is checked against the owner's
public key (``glasu report verify --key OWNER.pub``), received out of band like the alignment
keys (``glasu align keygen``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from secure.report_html import SIGNATURE_ELEMENT, SIGNATURE_SLOT, render_html

SIGNATURE_TAG = b"glasu/privacy-report/v1/ed25519\n"
_ELEMENT = re.compile(
    r'<script type="application/json" id="' + SIGNATURE_ELEMENT + r'">(?P<body>[^<]*)</script>'
)


class ReportNotGenuine(ValueError):
    """The report was altered, is unsigned, or was signed by another key: one sentence."""


def fingerprint(key: VerifyKey) -> str:
    """The first 128 bits of the SHA-256 of the public key, hex in groups of four."""
    digest = hashlib.sha256(bytes(key)).hexdigest()[:32]
    return " ".join(digest[i : i + 4] for i in range(0, 32, 4))


def canonical(content: Mapping[str, Any]) -> bytes:
    return json.dumps(
        content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _about(key: SigningKey) -> dict[str, str]:
    public = key.verify_key
    return {
        "algorithm": "ed25519",
        "public_key": bytes(public).hex(),
        "fingerprint": fingerprint(public),
    }


def signed_html(content: Mapping[str, Any], key: SigningKey) -> str:
    page = render_html(content, signature=_about(key))
    signature = key.sign(SIGNATURE_TAG + page.encode("utf-8")).signature.hex()
    slot = f'"signature": "{SIGNATURE_SLOT}"'
    assert page.count(slot) == 1
    return page.replace(slot, f'"signature": "{signature}"')


def signed_json(content: Mapping[str, Any], key: SigningKey) -> str:
    signature = key.sign(SIGNATURE_TAG + canonical(content)).signature.hex()
    document = {"report": content, "signature": {**_about(key), "signature": signature}}
    return json.dumps(document, sort_keys=True, indent=2, allow_nan=False) + "\n"


def verify_report(text: str, *, expected: VerifyKey | None = None) -> str:
    """The fingerprint of the key that signed ``text`` (an HTML or JSON report), or
    :class:`ReportNotGenuine` saying why not."""
    if text.lstrip().startswith("{"):
        return _verify_json(text, expected)
    return _verify_html(text, expected)


def _key_of(about: Any, expected: VerifyKey | None) -> tuple[VerifyKey, bytes]:
    try:
        key = VerifyKey(bytes.fromhex(about["public_key"]))
        signature = bytes.fromhex(about["signature"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportNotGenuine(f"its signature element is damaged ({exc})") from None
    if expected is not None and bytes(key) != bytes(expected):
        raise ReportNotGenuine(
            f"it is signed by key {fingerprint(key)}, not by the given key {fingerprint(expected)}"
        )
    return key, signature


def _check(key: VerifyKey, message: bytes, signature: bytes) -> str:
    try:
        key.verify(SIGNATURE_TAG + message, signature)
    except (BadSignatureError, ValueError):
        raise ReportNotGenuine(
            f"it was altered after key {fingerprint(key)} signed it (the signature does not match"
            " its content)"
        ) from None
    return fingerprint(key)


def _verify_html(text: str, expected: VerifyKey | None) -> str:
    found = list(_ELEMENT.finditer(text))
    if len(found) != 1:
        raise ReportNotGenuine(
            "it is not a signed glasu report (it has no signature element)"
            if not found
            else "it has more than one signature element"
        )
    try:
        about = json.loads(found[0]["body"])
    except json.JSONDecodeError:
        raise ReportNotGenuine("its signature element is not valid JSON") from None
    key, signature = _key_of(about, expected)
    slot = json.dumps({**about, "signature": SIGNATURE_SLOT}, sort_keys=True)
    element = found[0]
    signed = text[: element.start("body")] + slot + text[element.end("body") :]
    return _check(key, signed.encode("utf-8"), signature)


def _verify_json(text: str, expected: VerifyKey | None) -> str:
    try:
        document = json.loads(text)
        content, about = document["report"], document["signature"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ReportNotGenuine(
            "it is not a signed glasu report (JSON without a signature)"
        ) from None
    key, signature = _key_of(about, expected)
    return _check(key, canonical(content), signature)
