"""The training recipe that chooses itself from the data: for the settings a user did not give,
the values ``glasu train`` runs with, each with a one-line reason.

Pure and torch-free: the data enters as its shape (its labelled nodes), whether the run is
private, and the backbone (None: not given, the recipe chooses it). Without differential privacy
the recipe chooses the ``sign`` backbone (``models.config.PRECOMPUTED_BACKBONES``): on the scale
map's CSBM graphs the product's message-passing default (gcnii, batch 16, Q=4 stale rounds)
stays 40 points under one party's SGC, while sign with this recipe comes within 2 points of
centralised training (docs/results.md, "Is the federated model worth having at scale?"). Under
differential privacy sign runs the private sign design (``models.private_sign``: one release per
party, in process or over the service), which the recipe chooses there too
(:data:`SIGN_UNDER_DP`): on graphs where the label holder's own graph is sparse and its partners'
dense it gains 9 to 32 points over the party alone at epsilon 1 to 8, where the per-pass private
gcnii stays under the party alone everywhere measured (docs/privacy.md 1.5). The message-passing
backbones keep ``TrainConfig``'s defaults, which the golden histories pin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from models.config import PRECOMPUTED_BACKBONES, TrainConfig

#: Largest full batch: above it, batches of this many labelled nodes
MAX_FULL_BATCH = 1024


@dataclass(frozen=True)
class Choice:
    """One setting the recipe chose: the ``TrainConfig`` field, its value, and why."""

    field: str
    value: Any
    reason: str

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


@dataclass(frozen=True)
class Recipe:
    """The recipe's choices (none: the backbone runs with ``TrainConfig``'s defaults)."""

    backbone: str
    choices: tuple[Choice, ...]
    note: str = ""

    def apply(self, config: TrainConfig, *, given: Iterable[str]) -> tuple[TrainConfig, Recipe]:
        """``config`` with the choices whose flag ``given`` lacks (an explicit flag always
        wins), and the recipe of the choices applied."""
        given = set(given)
        taken = tuple(
            c
            for c in self.choices
            if c.flag not in given
            # K <= L: a K given keeps the layers it needs
            and not (
                c.field == "layers" and "--agg-layers" in given and config.agg_layers > c.value
            )
        )
        chosen = dataclasses.replace(config, **{c.field: c.value for c in taken})
        return chosen, dataclasses.replace(self, choices=taken)

    def describe(self) -> str:
        """The block ``glasu train`` prints: each choice, its value and its reason."""
        head = f"recipe for --backbone {self.backbone}"
        if not self.choices:
            return f"{head}: {self.note or 'every setting as given or by default'}"
        width = max(len(f"{c.flag} {c.value}") for c in self.choices)
        lines = [f"  {f'{c.flag} {c.value}':<{width}}  {c.reason}" for c in self.choices]
        return "\n".join([f"{head} (a flag given wins):", *lines])


#: Whether the recipe chooses sign under differential privacy (the private sign design) when no
#: backbone is given: the map shows it beats the party alone where partners' graphs are denser
#: (issue 40), and a kept model scores new customers without a new release
SIGN_UNDER_DP = True

#: Hops of sign's propagation the recipe chooses, and its learning rate
RECIPE_HOPS, RECIPE_LR = 10, 0.002


def choose_recipe(*, backbone: str | None, labelled: int | None, private: bool = False) -> Recipe:
    """The recipe for a run of ``backbone`` (None: not given, the recipe chooses) with
    ``labelled`` training labels (``None``: unknown here, e.g. the parties' workers read their
    own folders), with differential privacy or not (``private``)."""
    chosen: tuple[Choice, ...] = ()
    if backbone is None:
        if private and not SIGN_UNDER_DP:
            return Recipe(
                TrainConfig.backbone,
                (),
                note="the defaults: under differential privacy the recipe keeps them until the "
                "map shows the private sign design pays (--backbone sign runs it, "
                "docs/privacy.md 3.8)",
            )
        backbone = "sign"
        reason = (
            "the private sign design: one release per party, each party's propagation averaging "
            "its noise (docs/privacy.md 3.8)"
            if private
            else "no differential privacy: each party's features propagated over its own graph "
            "beat the sampled message-passing backbones by 40 points at 20k-100k nodes"
        )
        chosen = (Choice("backbone", backbone, reason),)
    if backbone not in PRECOMPUTED_BACKBONES:
        return Recipe(
            backbone,
            (),
            note="the defaults (the recipe chooses for the precomputed backbones: "
            + ", ".join(sorted(PRECOMPUTED_BACKBONES))
            + ")",
        )
    if labelled is None:
        batch, batch_reason = MAX_FULL_BATCH, "every labelled node, up to this many"
    elif labelled <= MAX_FULL_BATCH:
        batch = labelled
        batch_reason = (
            f"all {labelled} labelled nodes: a pass over precomputed features is cheap, and "
            "a full batch removes the gradient noise that batch 16 left"
        )
    else:
        batch = MAX_FULL_BATCH
        batch_reason = f"{labelled} labelled nodes, in batches of {MAX_FULL_BATCH}"
    choices = (
        *chosen,
        Choice(
            "hops",
            RECIPE_HOPS,
            "propagation reaches further, and each party's hop weights learn which hops "
            "matter (CSBM 20k: 94.6% against 86.2% with 3 hops; Cora 83.4% against 80.9%)",
        ),
        Choice("layers", 1, "one layer per party on its K-hop features (SIGN's split model)"),
        Choice("agg_layers", 1, "the layer that meets at the service"),
        Choice("batch_size", batch, batch_reason),
        Choice(
            "stale",
            1,
            "no stale rounds: with large batches a round is one step, and stale statistics "
            "cost accuracy (Q=4: 79% against 84% on CSBM 20k)",
        ),
        Choice(
            "lr",
            RECIPE_LR,
            "full batches of few labels: a smaller step overfits less (CSBM 20k: +1.2 points)",
        ),
    )
    return Recipe(backbone, choices)
