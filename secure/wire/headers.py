"""The names of the HTTP headers of the wire protocol, for the service (which reads and writes
them) and the clients (which write and read them) alike (docs/protocol.md).

A binary body carries its shape and its encoding in headers:

- ``X-Glasu-Shape``: ``n`` for a node set, ``rows,cols`` for a matrix, the whole set's element
  count for a part of a blinded set;
- ``X-Glasu-Encoding``: how the body's bytes encode the values: ``int64`` (node ids and
  positions, little-endian), ``float32`` (a plaintext share, little-endian, row-major),
  ``ckks`` (framed CKKS ciphertexts, ``secure/ckks.py``) or ``ristretto255`` (blinded set
  elements);
- ``X-Glasu-Count`` (on a sum): how many shares it holds;
- ``X-Glasu-Signature`` (on a blinded set's parts, optional): the poster's Ed25519 signature of
  the whole set, hex, relayed unchecked.

Every call but ``/healthz`` and the docs carries a bearer token in ``Authorization``.
"""

from __future__ import annotations

SHAPE_HEADER = "X-Glasu-Shape"
ENCODING_HEADER = "X-Glasu-Encoding"
COUNT_HEADER = "X-Glasu-Count"
SIGNATURE_HEADER = "X-Glasu-Signature"
AUTHORIZATION_HEADER = "Authorization"
