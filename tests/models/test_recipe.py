"""models.recipe: what the recipe chooses from the data's shape, and that a flag given wins."""

from __future__ import annotations

from models.config import TrainConfig
from models.recipe import MAX_FULL_BATCH, RECIPE_HOPS, RECIPE_LR, choose_recipe


def _values(backbone: str | None, labelled: int | None, **kw: bool) -> dict[str, object]:
    recipe = choose_recipe(backbone=backbone, labelled=labelled, **kw)
    return {c.field: c.value for c in recipe.choices}


def test_sign_trains_full_batches_of_the_labelled_nodes_without_stale_rounds() -> None:
    assert _values("sign", 140) == {
        "hops": RECIPE_HOPS,
        "layers": 1,
        "agg_layers": 1,
        "batch_size": 140,
        "stale": 1,
        "lr": RECIPE_LR,
    }
    assert _values("sign", 200)["batch_size"] == 200


def test_a_backbone_not_given_is_sign_with_or_without_privacy() -> None:
    chosen = _values(None, 140)
    assert chosen["backbone"] == "sign"
    assert chosen == {"backbone": "sign", **_values("sign", 140)}
    private = choose_recipe(backbone=None, labelled=140, private=True)
    assert private.backbone == "sign"
    assert {c.field: c.value for c in private.choices} == chosen
    assert "private sign design" in private.describe()
    config, _ = choose_recipe(backbone=None, labelled=140).apply(TrainConfig(dp=False), given=())
    assert (config.backbone, config.hops, config.layers) == ("sign", RECIPE_HOPS, 1)


def test_many_labels_are_batched_and_unknown_labels_take_the_largest_batch() -> None:
    assert _values("sign", 50_000)["batch_size"] == MAX_FULL_BATCH
    assert _values("sign", None)["batch_size"] == MAX_FULL_BATCH


def test_message_passing_backbones_keep_the_defaults_the_golden_histories_pin() -> None:
    for backbone in ("gcnii", "gcn", "gat"):
        recipe = choose_recipe(backbone=backbone, labelled=140)
        assert recipe.choices == ()
        config, _ = recipe.apply(TrainConfig(backbone=backbone), given=())  # type: ignore[arg-type]
        assert config == TrainConfig(backbone=backbone)  # type: ignore[arg-type]


def test_a_flag_given_wins_over_the_recipe() -> None:
    recipe = choose_recipe(backbone="sign", labelled=140)
    given = TrainConfig(backbone="sign", batch_size=16, stale=4)
    config, taken = recipe.apply(given, given={"--batch-size", "--stale"})
    assert (config.batch_size, config.stale, config.layers) == (16, 4, 1)
    assert {c.field for c in taken.choices} == {"hops", "layers", "agg_layers", "lr"}


def test_an_aggregation_depth_given_keeps_the_layers_it_needs() -> None:
    recipe = choose_recipe(backbone="sign", labelled=140)
    config, _ = recipe.apply(TrainConfig(backbone="sign", agg_layers=2), given={"--agg-layers"})
    assert (config.layers, config.agg_layers) == (4, 2)  # K <= L still


def test_the_printed_block_names_every_choice_and_its_reason() -> None:
    recipe = choose_recipe(backbone="sign", labelled=140)
    text = recipe.describe()
    lines = text.splitlines()
    assert lines[0].startswith("recipe for --backbone sign")
    for choice, line in zip(recipe.choices, lines[1:], strict=True):
        assert line.split()[:2] == [choice.flag, str(choice.value)]
        assert choice.reason in line
    assert "the defaults" in choose_recipe(backbone="gcnii", labelled=140).describe()
