"""Split noise under masks (docs/privacy.md section 11.2): the masked codec wraps a noisy share
modulo t instead of clamping or refusing it, so the sum of every party's share decodes exactly,
and it refuses noise whose sum could wrap; the run's default turns split noise on under masks."""

from __future__ import annotations

import numpy as np
import pytest

from models.config import TrainConfig
from models.release import DpRelease, ReleaseSettings
from secure.aggregation import ShareSlot, to_grid
from secure.ckks_context import share_bound
from secure.masking.bfv import DECODABLE_ABS_SUM
from secure.masking.codec import BfvSumAggregator
from secure.release_noise import ReleaseMechanism
from tests.secure.test_masking_codec import masked_codecs

SLOT = ShareSlot(pass_index=0, layer=1, part=0)


def test_split_noise_shares_beyond_the_bound_wrap_and_their_sum_decodes_exactly() -> None:
    codecs = [c.for_split_noise(clip=1.0, noise_std=60.0) for c in masked_codecs()]
    generator = np.random.default_rng(5)
    values = [to_grid(generator.normal(0.0, 60.0, size=(40, 16))) for _ in codecs]
    values[0][0, 0] = 600.0  # beyond share_bound and MAX_ABS_SUM, the sum still decodable
    values[1][0, 0] = -300.0
    assert codecs[0].value_bound(shares=3) == np.inf
    payloads = [c.encode(v, slot=SLOT) for c, v in zip(codecs, values, strict=True)]
    total = BfvSumAggregator().add(payloads, rows=40, cols=16)
    decoded = codecs[2].decode_sum(total, rows=40, cols=16)
    np.testing.assert_array_equal(decoded, np.sum(values, axis=0).astype(np.float32))


def test_a_codec_without_split_noise_still_refuses_a_value_beyond_the_bound() -> None:
    codec = masked_codecs()[0]
    with pytest.raises(ValueError, match="could wrap modulo t"):
        codec.encode(np.full((2, 2), share_bound(clients=3) + 1.0), slot=SLOT)


def test_split_noise_whose_sum_could_wrap_is_refused_with_the_way_out() -> None:
    codec = masked_codecs()[0]
    std = DECODABLE_ABS_SUM / 7 / np.sqrt(3) * 1.01
    with pytest.raises(ValueError, match="--no-split-noise"):
        codec.for_split_noise(clip=1.0, noise_std=std)
    assert codec.for_split_noise(clip=1.0, noise_std=std / 1.05).value_bound(shares=3) == np.inf


def test_masks_with_dp_split_the_noise_by_default_and_the_flag_keeps_it_unshared() -> None:
    masked = TrainConfig(secure_aggregation="masks", clients=3)
    assert masked.splits_noise and (masked.privacy_request() or {})["split_noise"] is True
    privacy = masked.session_privacy(clients=3, passes_total=10)
    assert privacy is not None and privacy.split_noise
    kept = TrainConfig(secure_aggregation="masks", clients=3, split_noise=False)
    assert "split_noise" not in (kept.privacy_request() or {})
    assert not TrainConfig().splits_noise  # CKKS without masks: unchanged
    assert not TrainConfig(secure_aggregation="masks", dp=False).splits_noise
    assert not TrainConfig(secure_aggregation="masks", shared_noise=True).splits_noise


def test_a_split_noise_release_takes_only_sums_of_every_share() -> None:
    privacy = TrainConfig(secure_aggregation="masks").session_privacy(clients=4, passes_total=4)
    assert privacy is not None
    mechanism = ReleaseMechanism.of(privacy, width=16, encoding="bfv-masked")
    assert mechanism.split_noise
    settings = ReleaseSettings(
        width=16, clip=1.0, noise_std=mechanism.noise_std, noise=None,  # type: ignore[arg-type]
        projection_seed=0, mechanism=mechanism,
    )  # fmt: skip
    assert DpRelease(settings).fewest_shares(4) == 4


def test_no_split_noise_on_the_command_line_keeps_the_unshared_noise_under_masks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clients.cli import train_cmd
    from clients.cli.main import main
    from clients.cli.train_config import config_from_args

    reached: list[TrainConfig] = []
    monkeypatch.setattr(train_cmd, "run", lambda args: reached.append(config_from_args(args)) or 0)
    assert main(["train", "--secure-aggregation", "masks", "--no-split-noise"]) == 0
    assert main(["train", "--secure-aggregation", "masks"]) == 0
    assert [c.splits_noise for c in reached] == [False, True]
