"""Masked shares in sessions: the worker's codec that masks a share for its slot and encrypts it
under BFV, and the service's aggregator that adds BFV ciphertexts it can neither read nor unmask.

Encoding ``bfv-masked`` (docs/secure-aggregation.md). A share's values, on the 2^-12 share grid,
become integers modulo ``t`` (:mod:`secure.masking.bfv`); the worker adds its pairwise mask for
the slot (session id, pass, layer, part, and the pass's participants:
:mod:`secure.masking.streams`) and encrypts the masked residues with the session's shared BFV
key. The service adds the ciphertexts with a context that holds the parameters alone (no key of
the session: SEAL adds ciphertexts under any context of the same parameters), so it needs no key
file. Workers hold the secret key and encrypt with it, each ciphertext saved seeded as the CKKS
path's (``secure/ckks_packing.py``): about 6 bytes a value, where TenSEAL's public-key
``bfv_vector`` takes 12. The masks cancel only in the sum of the share of every participant of
the pass (every party, unless a pass went on without one under stragglers "continue":
:meth:`MaskedBfvCodec.begin_pass` takes the set the service states and checks it): a sum of
fewer, or a single share served as a sum, decodes to uniform noise, so a masked sum must hold
exactly the pass's participants (:meth:`MaskedBfvCodec.fewest_shares`,
:meth:`MaskedBfvCodec.most_shares`).

Chunks travel in the CKKS path's frame (``secure/ckks_frame.py``: magic, key id of the BFV public
context, length-prefixed chunks) and are checked by its chunk layout before SEAL parses them
(``secure.ckks_packing.ChunkLayout.of_bfv``). A sum refuses a share under another key id than
its first share's.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tenseal as ts
from tenseal import sealapi

from secure.aggregation import (
    SHARE_GRID,
    EmbeddingCodec,
    PayloadError,
    RunningSum,
    ShareSlot,
    SumAggregator,
)
from secure.ckks_context import (
    MAX_SHARES,
    KeyMaterialError,
    context_key_id,
    share_bound,
    write_context_files,
)
from secure.ckks_frame import frame_chunks, max_payload_bytes, parse_frame
from secure.ckks_packing import ChunkLayout, SaveBuffer, tenseal_vector_bytes
from secure.masking.bfv import (
    COEFF_MOD_BIT_SIZES,
    DECODABLE_ABS_SUM,
    PLAIN_MODULUS,
    POLY_MODULUS_DEGREE,
    SLOTS_PER_CIPHERTEXT,
    add_mask,
    decode_sum,
    encode_share,
    new_bfv_context,
    public_bfv_context,
)
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from secure.masking.participants import MIN_SHARES_IN_SUM, participants_refusal
from secure.masking.secret_material import SecretBytes
from secure.masking.streams import MaskSlot, party_mask
from secure.protocol import ProtocolViolation

ENCODING = "bfv-masked"
SECRET_CONTEXT_NAME = "bfv-secret.context"
PUBLIC_CONTEXT_NAME = "bfv-public.context"

#: How many standard deviations of a split-noise sum's noise must decode: 7 (a value beyond
#: has probability about 2.6e-12, and a run sends some 10^8 values).
WRAP_SIGMAS = 7

_native_vector_type = ts._ts_cpp.BFVVector
NativeVector = Any


def generate_bfv_keys(out_dir: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write the shared BFV key of masked sessions: ``bfv-secret.context`` (mode 0600, every
    worker's) and ``bfv-public.context`` (its public half; nobody needs it to run a session)."""
    return write_context_files(
        out_dir, new_bfv_context, names=(SECRET_CONTEXT_NAME, PUBLIC_CONTEXT_NAME),
        overwrite=overwrite,
    )  # fmt: skip


def load_bfv_secret_context(path: Path) -> ts.Context:
    """A worker's BFV context from ``bfv-secret.context``; :class:`KeyMaterialError` for a file
    without a secret key or with other parameters."""
    try:
        context = ts.context_from(Path(path).read_bytes(), n_threads=1)
    except OSError as error:
        raise KeyMaterialError(f"{path}: cannot read the key file ({error.strerror})") from None
    except Exception as error:  # protobuf/SEAL parse errors surface as several types
        raise KeyMaterialError(f"{path}: not a TenSEAL context ({error})") from None
    if not context.is_private():
        raise KeyMaterialError(f"{path} holds no secret key: workers need {SECRET_CONTEXT_NAME}")
    check_bfv_parameters(context, origin=str(path))
    return context


def check_bfv_parameters(context: ts.Context, *, origin: str) -> None:
    """:class:`KeyMaterialError` unless ``context`` has :mod:`secure.masking.bfv`'s parameters."""
    data = context.seal_context().data
    parms = data.key_context_data().parms()
    found = (
        parms.scheme(),
        parms.poly_modulus_degree(),
        parms.plain_modulus().value(),
        tuple(prime.bit_count() for prime in parms.coeff_modulus()),
    )
    expected = (
        ts.SCHEME_TYPE.BFV.value,
        POLY_MODULUS_DEGREE,
        PLAIN_MODULUS,
        COEFF_MOD_BIT_SIZES,
    )
    if found != expected:
        raise KeyMaterialError(
            f"{origin}: (scheme, N, t, coefficient bits) = {found}, expected {expected}: make the "
            "key with `glasu keygen --scheme bfv`"
        )


class MaskedBfvCodec(EmbeddingCodec):
    """Party ``party`` of ``parties`` in session ``session_id``: masks each share with its pair
    secrets for the share's slot and encrypts it under the shared BFV key; decrypts sums."""

    encoding = ENCODING

    def __init__(
        self,
        context: ts.Context,
        *,
        party: int,
        parties: int,
        session_id: str,
        pair_secrets: Mapping[int, SecretBytes],
    ) -> None:
        if not context.is_private():
            raise KeyMaterialError("MaskedBfvCodec needs the secret BFV context")
        check_bfv_parameters(context, origin="the BFV context")
        if parties < MIN_SHARES_IN_SUM:
            raise ValueError(
                f"masks protect from {MIN_SHARES_IN_SUM} parties up: with {parties} the sum "
                "tells each party the other's share"
            )
        expected = set(range(parties)) - {party}
        if set(pair_secrets) != expected:
            raise ValueError(
                f"party {party} of {parties} needs a pair secret with each of {sorted(expected)},"
                f" has {sorted(pair_secrets)}"
            )
        self._context = context
        self._layout = ChunkLayout.of_bfv(context)
        native = context.data
        self._encoder = sealapi.BatchEncoder(native.seal_context())
        self._encryptor = sealapi.Encryptor(native.seal_context(), native.secret_key())
        self.key_id = context_key_id(context)
        self.party, self.parties, self.session_id = party, parties, session_id
        self._pair_secrets = dict(pair_secrets)
        self._wraps = False  # shares reduced modulo t, not bounded: for_split_noise
        # (pass, its participants) as the service stated them (begin_pass); until then every
        # party, as in-process runs have it
        self._pass: tuple[int, tuple[int, ...]] | None = None

    @classmethod
    def from_keys(
        cls,
        context: ts.Context,
        own: MaskingKeyPair,
        peers: PinnedPeerKeys,
        *,
        party: int,
        parties: int,
        session_id: str,
    ) -> MaskedBfvCodec:
        """The codec of a party with its own key pair and its peers' pinned public keys
        (ValueError for a missing, extra or own pinned key)."""
        peers.check_parties(parties, party)
        return cls(
            context, party=party, parties=parties, session_id=session_id,
            pair_secrets=peers.pair_secrets(own, party=party),
        )  # fmt: skip

    def value_bound(self, *, shares: int) -> float:
        # as the CKKS path's: a masked run clips exactly as an unmasked one, and a sum of M
        # shares stays within MAX_ABS_SUM (512), half of what decodes modulo t. A split-noise
        # share is not bounded (a clamp share by share would break the noise's analysis)
        return math.inf if self._wraps else share_bound(clients=shares)

    def for_split_noise(self, *, clip: float, noise_std: float) -> MaskedBfvCodec:
        """This codec for split-noise shares (docs/privacy.md section 11.2): each share is
        reduced modulo t as it is, never clamped nor refused, since only the sum must decode.
        ValueError unless the sum of the parties' shares stays decodable: ``parties * clip``
        of signal plus :data:`WRAP_SIGMAS` standard deviations of the summed noise within
        ``DECODABLE_ABS_SUM`` (a wrapped sum costs accuracy, not privacy: it is
        post-processing of the true sum)."""
        signal = self.parties * clip
        spread = WRAP_SIGMAS * noise_std * math.sqrt(self.parties)
        if signal + spread > DECODABLE_ABS_SUM:
            raise ValueError(
                f"split noise of std {noise_std:.4g} per party does not fit BFV's plaintext "
                f"modulus: a sum of {self.parties} shares ({signal:g} of clipped signal plus "
                f"{WRAP_SIGMAS} std of noise, {spread:.4g}) could exceed the {DECODABLE_ABS_SUM:g}"
                " that decodes; lower the noise (a larger epsilon or fewer releases) or run "
                "unsplit noise (--no-split-noise)"
            )
        wrapping = copy.copy(self)
        wrapping._wraps = True
        return wrapping

    def fewest_shares(self, clients: int) -> int:
        """Every participant's share: the masks cancel only in the sum of all of them."""
        return len(self._participants(None))

    def most_shares(self, clients: int) -> int:
        """No share beyond the participants': a sum holds exactly their shares."""
        return len(self._participants(None))

    def begin_pass(self, pass_index: int, participants: Sequence[int] | None) -> None:
        """Mask the shares of pass ``pass_index`` over ``participants`` (the service's word);
        :class:`ProtocolViolation`, before anything leaves, unless they are a set this party
        may mask over (:func:`secure.masking.participants.participants_refusal`)."""
        refusal = participants_refusal(participants, party=self.party, parties=self.parties)
        if refusal is not None:
            raise ProtocolViolation(f"pass {pass_index}: {refusal}; nothing of it is sent")
        assert participants is not None
        self._pass = (pass_index, tuple(sorted(participants)))

    def _participants(self, pass_index: int | None) -> tuple[int, ...]:
        """The participants of pass ``pass_index`` (None: of the pass begun last): as
        :meth:`begin_pass` was told, or every party if it never was."""
        if self._pass is None:
            return tuple(range(self.parties))
        begun, members = self._pass
        if pass_index is not None and pass_index != begun:
            raise ProtocolViolation(f"a share of pass {pass_index} in pass {begun}")
        return members

    def encode(self, matrix: np.ndarray, *, slot: ShareSlot | None = None) -> bytes:
        if slot is None:
            raise ValueError("a masked share needs its slot (pass, layer, part)")
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        values = np.asarray(matrix, dtype=np.float64).reshape(-1)
        if not np.isfinite(values).all():
            raise ValueError("share contains NaN or infinite values")
        bound = self.value_bound(shares=self.parties)
        largest = float(np.abs(values).max(initial=0.0))
        if not self._wraps and (
            largest > bound + SHARE_GRID / 2 or largest * self.parties > DECODABLE_ABS_SUM
        ):
            raise ValueError(
                f"share has |value| {largest:.4g} > {bound:g}: a sum of {self.parties} shares "
                f"could wrap modulo t (bound shares with value_bound first)"
            )
        members = self._participants(slot.pass_index)
        # a pass of every party leaves the set unbound (it is the session's), any other binds it
        bound = members if len(members) < self.parties else ()
        where = MaskSlot(
            self.session_id, slot.pass_index, slot.layer, slot.part, slot.rows, participants=bound
        )
        mask = party_mask(
            self._pair_secrets, where, party=self.party, count=values.size, modulus=PLAIN_MODULUS
        )
        masked = add_mask(encode_share(values, wrap=self._wraps), mask)
        step = SLOTS_PER_CIPHERTEXT
        with SaveBuffer() as buffer:
            chunks = [
                self._encrypt_chunk(masked[start : start + step], buffer)
                for start in range(0, masked.size, step)
            ]
        return frame_chunks(chunks, key_id=self.key_id)

    def _encrypt_chunk(self, residues: np.ndarray, buffer: SaveBuffer) -> bytes:
        """Residues encrypted with the secret key and saved seeded (``a`` as the seed that drew
        it: half the bytes of TenSEAL's public-key ``bfv_vector``), in TenSEAL's BFVVector
        framing, as the CKKS path's ``SecretKeyCipher`` does."""
        plaintext = sealapi.Plaintext()
        self._encoder.encode(residues.astype(np.uint64).tolist(), plaintext)
        seeded = buffer.saved(self._encryptor.encrypt_symmetric(plaintext))
        return tenseal_vector_bytes(seeded, slots=residues.size, scale=None)

    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        if parse_frame(payload).key_id != self.key_id:
            raise PayloadError("the sum is not under this worker's BFV key")
        vectors = _read_vectors(self._context, self._layout, payload, rows=rows, cols=cols)
        residues = [np.asarray(vector.decrypt(), dtype=np.int64) for vector in vectors]
        flat = np.concatenate(residues) if residues else np.zeros(0, dtype=np.int64)
        return decode_sum(flat).reshape(rows, cols).astype(np.float32)


def chunk_sizes(*, rows: int, cols: int) -> list[int]:
    """How many values each BFV chunk of a (rows x cols) share holds."""
    if rows < 0 or cols < 0:
        raise PayloadError(f"shape ({rows}, {cols}) has a negative dimension")
    total, step = rows * cols, SLOTS_PER_CIPHERTEXT
    return [min(step, total - start) for start in range(0, total, step)]


def _read_vectors(
    context: ts.Context, layout: ChunkLayout, payload: bytes, *, rows: int, cols: int
) -> list[NativeVector]:
    """The chunks of a ``bfv-masked`` payload for a (rows x cols) slot, each checked by the
    layout before SEAL parses it; :class:`PayloadError` if it does not fit."""
    expected = chunk_sizes(rows=rows, cols=cols)
    if len(payload) > max_payload_bytes(rows=rows, cols=cols):
        raise PayloadError(f"bfv body of {len(payload)} bytes is too large for ({rows}, {cols})")
    frame = parse_frame(payload)
    if len(frame.spans) != len(expected):
        raise PayloadError(
            f"{len(frame.spans)} chunks, but ({rows}, {cols}) needs {len(expected)}"
            f" of {SLOTS_PER_CIPHERTEXT} values"
        )
    vectors = []
    for index, (chunk, values) in enumerate(zip(frame.iter_chunks(), expected, strict=True)):
        try:
            data, size = layout.checked(chunk)
            if size != values:
                raise ValueError(f"holds {size} values, expected {values}")
            vectors.append(_native_vector_type(context.data, data))
        except Exception as error:  # the layout's ValueError; TenSEAL raises assorted types
            raise PayloadError(f"chunk {index}: {error}") from None
    return vectors


class BfvSumAggregator(SumAggregator[tuple[bytes, list[NativeVector]]]):
    """The service's side: validates and adds BFV ciphertexts with a keyless context of the
    parameters (the service holds no key of a masked session)."""

    encoding = ENCODING

    def __init__(self) -> None:
        self._context = _parameters_context()
        self._layout = ChunkLayout.of_bfv(self._context)

    def read_share(
        self, payload: bytes, *, rows: int, cols: int
    ) -> tuple[bytes, list[NativeVector]]:
        vectors = _read_vectors(self._context, self._layout, payload, rows=rows, cols=cols)
        return parse_frame(payload).key_id, vectors

    def new_sum(self, *, rows: int, cols: int) -> BfvRunningSum:
        return BfvRunningSum()


class BfvRunningSum(RunningSum[tuple[bytes, list[NativeVector]]]):
    """Adds each share as it arrives (exact arithmetic modulo q: the order does not matter);
    every share under the first share's key id."""

    def __init__(self) -> None:
        self._clients: set[int] = set()
        self._key_id: bytes | None = None
        self._total: list[NativeVector] | None = None

    @property
    def clients(self) -> frozenset[int]:
        return frozenset(self._clients)

    def add(self, client: int, share: tuple[bytes, list[NativeVector]]) -> None:
        key_id, vectors = share
        if client in self._clients:
            raise ValueError(f"the share of client {client} is already in the sum")
        if len(self._clients) >= MAX_SHARES:
            raise ValueError(f"{len(self._clients) + 1} shares exceed the {MAX_SHARES} of BFV's")
        if self._total is None:
            self._key_id, self._total = key_id, vectors
        else:
            if key_id != self._key_id:
                raise ValueError(
                    f"share under BFV key id {key_id.hex()}, the sum's shares are under "
                    f"{(self._key_id or b'').hex()}"
                )
            if len(vectors) != len(self._total):
                raise ValueError(f"share of {len(vectors)} chunks added to {len(self._total)}")
            for accumulator, vector in zip(self._total, vectors, strict=True):
                accumulator.add_(vector)
        self._clients.add(client)

    def payload(self) -> bytes:
        if self._total is None or self._key_id is None:
            raise ValueError("nothing to add")
        return frame_chunks([vector.serialize() for vector in self._total], key_id=self._key_id)


@functools.cache
def _parameters_context() -> ts.Context:
    """A public BFV context of the parameters (its own fresh key, never used)."""
    return public_bfv_context(new_bfv_context())
