"""Masked secure aggregation against real processes (docs/secure-aggregation.md): a lying
service (tests/e2e/lying_service.py) hands worker 0 worker 1's single share as the sum of an
evaluation pass. With masks on, what worker 0 decodes is uncorrelated with that share, and the
service with worker 2's keys reads nothing of it either; without masks the same attack hands over
the share itself. A masked run's accuracy is the unmasked run's: the sum is exact."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_kit import correlation, fixed_masking_keys, masking_keys_of, start_federation
from lying_service import Exchange, lying_service

from clients.local.federation import train_over_http
from clients.local.processes import ManagedProcess, free_port
from models.config import TrainConfig
from models.layout import layout_federation
from models.trainer import train_inprocess
from secure.aggregation import SHARE_GRID, PlainCodec, rows_digest
from secure.ckks_frame import parse_frame
from secure.masking.bfv import PLAIN_MODULUS, decode_sum, decrypt
from secure.masking.codec import MaskedBfvCodec, generate_bfv_keys, load_bfv_secret_context
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from secure.masking.secret_material import SecretBytes
from secure.masking.streams import MaskSlot, party_mask

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# three clients, no DP (the attack needs none); passes: train 0, eval 1. hidden 128: the eval
# pass's share has 2708 x 128 = 346,624 values. The masking keys are fixed, but the session id
# (the service's) and so the masks differ from run to run: |correlation| < 0.01 is 5.9 standard
# deviations (1/sqrt(n) = 0.0017) of uncorrelated values, a failure once in 10^8 runs
MASKED = TrainConfig(
    clients=3, rounds=1, eval_every=0, hidden=128, dp=False, encryption="ckks",
    secure_aggregation="masks", seed=5, device="cpu",
)  # fmt: skip
VICTIM, FOOLED, COLLUDER, ATTACKED_PASS = 1, 0, 2, 1
SLOT_PATH = re.compile(r"/clients/(\d+)/passes/(\d+)/layers/(\d+)/(embedding|aggregate)$")


@dataclass
class SingleShareAsSum:
    """Capture every upload; answer the fooled worker's sum of the attacked pass's first layer
    with the victim's own share."""

    uploads: dict[tuple[int, int, int], tuple[bytes, str]] = field(default_factory=dict)
    served: tuple[bytes, str, int] | None = None  # (body, shape, layer)

    def __call__(self, exchange: Exchange) -> httpx.Response:
        match = SLOT_PATH.search(exchange.path)
        if match is None:
            return exchange.forward()
        client, pass_index, layer, what = int(match[1]), int(match[2]), int(match[3]), match[4]
        if what == "embedding" and exchange.method == "PUT":
            shape = exchange.headers["x-glasu-shape"]
            self.uploads[(client, pass_index, layer)] = (exchange.body, shape)
            return exchange.forward()
        answer = exchange.forward()
        attacked = (client, pass_index) == (FOOLED, ATTACKED_PASS) and self.served is None
        if what != "aggregate" or not attacked or answer.status_code != 200:
            return answer
        body, shape = self.uploads[(VICTIM, pass_index, layer)]
        self.served = (body, shape, layer)
        return httpx.Response(200, content=body, headers=answer.headers)


def run_attack(
    config: TrainConfig, dataset, root: Path, processes: list[ManagedProcess], extra
) -> tuple[SingleShareAsSum, str]:
    """Run ``config`` with every worker behind the lying service until every worker has
    exited (the fooled one may fail: it was served noise); the attack and the session id."""
    port = free_port()
    attack = SingleShareAsSum()
    with lying_service(f"http://127.0.0.1:{port}", attack) as proxy:
        fed = start_federation(
            config, dataset, root, processes, port=port, extra=extra,
            server_for=lambda client, url: proxy,
        )  # fmt: skip
        for worker in fed.workers:
            worker.process.wait(timeout=600)
    assert attack.served is not None, [w.tail() for w in fed.workers]
    return attack, fed.session_id


def test_a_single_masked_share_served_as_a_sum_decodes_to_noise_and_a_colluder_reads_nothing(
    tmp_path: Path, cora, processes: list[ManagedProcess]
) -> None:
    secret, _ = generate_bfv_keys(tmp_path / "keys")
    masking = fixed_masking_keys(tmp_path, MASKED.clients)
    attack, session_id = run_attack(
        MASKED, cora, tmp_path, processes,
        extra=lambda m: ["--secret-context", str(secret), *masking[m]],
    )  # fmt: skip
    assert attack.served is not None
    body, shape, layer = attack.served
    rows, cols = (int(v) for v in shape.split(","))
    context = load_bfv_secret_context(secret)

    def keys_of(m: int) -> tuple[MaskingKeyPair, PinnedPeerKeys]:
        return masking_keys_of(masking[m])

    def pair_secrets(m: int) -> dict[int, SecretBytes]:
        own, peers = keys_of(m)
        return peers.pair_secrets(own, party=m)

    # what the fooled worker decodes: its own codec on the served body
    fooled = MaskedBfvCodec.from_keys(
        context, *keys_of(FOOLED), party=FOOLED, parties=MASKED.clients, session_id=session_id
    )
    decoded = fooled.decode_sum(body, rows=rows, cols=cols)
    # the victim's share itself, unmasked with the victim's keys (the test holds every key)
    residues = decrypt(context, parse_frame(body).chunks)
    # an evaluation pass's share covers every node, in order (models/layerwise.py all_rows)
    slot = MaskSlot(session_id, ATTACKED_PASS, layer, 0, rows_digest(np.arange(cora.num_nodes)))
    mask = party_mask(
        pair_secrets(VICTIM), slot, party=VICTIM, count=residues.size, modulus=PLAIN_MODULUS
    )
    share = decode_sum(residues - mask).reshape(rows, cols)
    assert residues.size > 300_000 and np.abs(share).max() > 10 * SHARE_GRID  # a real share
    print(f"{residues.size} values: correlation {correlation(decoded, share):+.4f}")
    assert abs(correlation(decoded, share)) < 0.01
    # the service with the colluder's keys: the victim's share less the stream the colluder
    # shares with it is still masked by the stream of the victim and the honest worker
    colluder = pair_secrets(COLLUDER)
    known = party_mask(
        {VICTIM: colluder[VICTIM]}, slot, party=COLLUDER, count=residues.size,
        modulus=PLAIN_MODULUS,
    )  # fmt: skip
    best_guess = decode_sum(residues + known)  # the colluder's stream enters with -sign
    assert abs(correlation(best_guess, share)) < 0.01
    centred = (residues + known) % PLAIN_MODULUS
    assert abs(centred.mean() / PLAIN_MODULUS - 0.5) < 0.01  # uniform residues


def test_without_masks_the_same_attack_hands_over_the_share(
    tmp_path: Path, cora, processes: list[ManagedProcess]
) -> None:
    plain = dataclasses.replace(MASKED, encryption="none", secure_aggregation="none")
    attack, _ = run_attack(plain, cora, tmp_path, processes, extra=lambda m: [])
    assert attack.served is not None
    body, shape, layer = attack.served
    rows, cols = (int(v) for v in shape.split(","))
    decoded = PlainCodec().decode_sum(body, rows=rows, cols=cols)
    share = np.frombuffer(attack.uploads[(VICTIM, ATTACKED_PASS, layer)][0], "<f4")
    assert correlation(decoded, share) == pytest.approx(1.0)


def test_a_masked_run_over_http_equals_the_unmasked_run(cora, tmp_path: Path) -> None:
    config = dataclasses.replace(MASKED, rounds=4, eval_every=2, hidden=32)
    over_http = train_over_http(
        config, layout_federation(config, cora), cora, progress=False, work_dir=tmp_path
    )
    unmasked = dataclasses.replace(config, secure_aggregation="none")
    in_process = train_inprocess(unmasked, dataset=cora, progress=False)
    assert [h.test_accuracy for h in over_http.history] == pytest.approx(
        [h.test_accuracy for h in in_process.history], abs=1e-9
    )
    assert over_http.test_accuracy == pytest.approx(in_process.test_accuracy, abs=1e-9)
    # the masked run's workers held the BFV key and their own masking keys, nothing of CKKS
    assert (tmp_path / "keys" / "bfv-secret.context").exists()
    assert not (tmp_path / "keys" / "secret.context").exists()
