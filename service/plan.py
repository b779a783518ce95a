"""A session's fixed plan: its configuration plus everything derived from it (the pass schedule
and the output nodes of each pass, the layer widths, the privacy plan). Immutable, so it is
cached per session."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from secure.privacy import NoiseMultiplierSource, SessionPrivacy
from secure.protocol import PART_VALUES, ShareEncoding
from secure.schedule import ONE_PASS_KINDS, PassSpec, SessionSchedule, passes_total
from secure.wire.sessions import SessionConfigView, SessionCreate


@dataclass(frozen=True, slots=True)
class PlanOutline:
    """What a listing shows of a session's plan."""

    label: str | None
    clients: int
    passes_total: int

    @classmethod
    def from_json(cls, text: str) -> PlanOutline:
        """Read from the stored plan JSON without building the plan: the node lists are skipped
        by pydantic's parser rather than turned into Python objects (6 times faster than
        ``json.loads``)."""
        config = _StoredOutline.model_validate_json(text).config
        total = passes_total(
            scoring=config.kind in ONE_PASS_KINDS,
            rounds=config.rounds,
            eval_every=config.eval_every,
        )
        return cls(label=config.label, clients=config.clients, passes_total=total)


class _ConfigOutline(BaseModel):
    kind: str = "training"
    clients: int
    rounds: int
    eval_every: int
    label: str | None = None


class _StoredOutline(BaseModel):
    config: _ConfigOutline


@dataclass(frozen=True)
class SessionPlan:
    session_id: str
    config: SessionCreate  # privacy.noise_multiplier holds the z in use
    public_context_sha256: str | None
    schedule: SessionSchedule
    widths: dict[int, int]  # columns of a share per aggregation layer (+1: presence, "union")
    privacy: SessionPrivacy | None
    # layers + 1: the label holder's broadcast gradient in training passes (GLASU B.2, no DP)
    gradient_layer: int | None
    # layers + 1: the answering party's predictions in a scoring session's pass, where the
    # session shares them (``share_predictions``)
    answer_layer: int | None = None

    @classmethod
    def build(
        cls,
        session_id: str,
        config: SessionCreate,
        *,
        noise_multiplier_source: NoiseMultiplierSource = "given",
        public_context_sha256: str | None = None,
    ) -> SessionPlan:
        """``config.privacy`` must hold the z in use (see ``secure.privacy.SessionPrivacy``)."""
        if config.kind in ONE_PASS_KINDS:
            schedule = SessionSchedule.scoring_passes(
                score_nodes=config.eval_nodes, seed=config.seed
            )
        else:
            schedule = SessionSchedule.create(
                rounds=config.rounds,
                eval_every=config.eval_every,
                train_nodes=config.train_nodes,
                eval_nodes=config.eval_nodes,
                batch_size=config.batch_size,
                seed=config.seed,
            )
        privacy = None
        if config.privacy is not None:
            privacy = SessionPrivacy.restore(
                {
                    **config.privacy.model_dump(),
                    "noise_multiplier_source": noise_multiplier_source,
                },
                clients=config.clients,
                passes_total=schedule.passes_total,
                encrypted=config.encryption == "ckks",
                masked=config.secure_aggregation == "masks",
            )
            if post_processes_release(config):
                privacy = dataclasses.replace(privacy, post_processing=True)
        # a presence column over the union, but in the private sign design's blocks: a sender's
        # block is zero where it lacks a node, and its receiver reads the others' sum as it is
        presence = config.nodes == "union" and not releases_blocks(config)
        widths = {a.layer: a.width + presence for a in config.agg_layers}
        gradient_layer = answer_layer = None
        if config.kind == "scoring":
            if config.share_predictions != "none":
                answer_layer = config.layers + 1
                widths[answer_layer] = config.agg_layers[-1].width
        elif config.label_holder is not None and privacy is None:
            gradient_layer = config.layers + 1
            widths[gradient_layer] = config.agg_layers[-1].width
        return cls(
            session_id=session_id,
            config=config,
            public_context_sha256=public_context_sha256,
            schedule=schedule,
            widths=widths,
            privacy=privacy,
            gradient_layer=gradient_layer,
            answer_layer=answer_layer,
        )

    @classmethod
    def from_json(cls, session_id: str, text: str) -> SessionPlan:
        stored = json.loads(text)
        return cls.build(
            session_id,
            SessionCreate.model_validate(stored["config"]),
            noise_multiplier_source=stored["noise_multiplier_source"] or "given",
            public_context_sha256=stored["public_context_sha256"],
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "config": self.config.model_dump(mode="json"),
                "noise_multiplier_source": (
                    self.privacy.noise_multiplier_source if self.privacy else None
                ),
                "public_context_sha256": self.public_context_sha256,
            }
        )

    @property
    def outline(self) -> PlanOutline:
        return PlanOutline(
            label=self.config.label, clients=self.clients, passes_total=self.passes_total
        )

    @property
    def clients(self) -> int:
        return self.config.clients

    @property
    def post_processing(self) -> bool:
        """A scoring session of a kept release: its pass releases nothing (its shares are
        post-processing of each sender's one release) and holds the scored nodes' rows."""
        return post_processes_release(self.config)

    @property
    def encoding(self) -> ShareEncoding:
        return self.config.encoding

    @property
    def passes(self) -> tuple[PassSpec, ...]:
        return self.schedule.passes

    @property
    def passes_total(self) -> int:
        return self.schedule.passes_total

    @property
    def top_layer(self) -> int:
        return self.config.layers

    @property
    def first_agg_layer(self) -> int:
        return self.config.agg_layers[0].layer

    def last_layer(self, pass_index: int) -> int:
        """The layer whose sum completes the pass: the gradient's in a training pass of a
        label holder's session, the answer's in a scoring session that shares it, else the last
        aggregation layer."""
        if self.gradient_layer is not None and self.passes[pass_index].kind == "train":
            return self.gradient_layer
        if self.answer_layer is not None:
            return self.answer_layer
        return self.config.agg_layers[-1].layer

    def samples(self, pass_index: int) -> bool:
        """Whether the pass's rows are its output nodes' sampled neighbourhoods (node sets
        exchanged below the top): a training pass, or a scoring session's ``sampled`` pass;
        otherwise an evaluation pass over every aligned node."""
        if self.passes[pass_index].kind == "train":
            return True
        return self.config.kind == "scoring" and self.config.scoring_pass == "sampled"

    def agg_layers_below(self, layer: int) -> list[int]:
        return [a.layer for a in self.config.agg_layers if a.layer < layer]

    def output_nodes(self, pass_index: int) -> np.ndarray:
        return self.schedule.output_nodes(pass_index)

    def output_rows(self, pass_index: int) -> int:
        return self.schedule.output_rows(pass_index)

    @property
    def part_values(self) -> int | None:
        """Values per part of a share (None, the protocol's default: sessions stored before the
        service sized them)."""
        return self.config.part_values

    def config_view(self) -> SessionConfigView:
        fields = self.config.model_dump(exclude={"train_nodes", "eval_nodes", "part_values"})
        return SessionConfigView(
            **fields,
            part_values=self.part_values or PART_VALUES,
            train_nodes_count=len(self.config.train_nodes),
            eval_nodes_count=len(self.config.eval_nodes),
            encoding=self.encoding,
            public_context_sha256=self.public_context_sha256,
        )


def releases_blocks(config: SessionCreate) -> bool:
    """A session whose shares are the private sign design's blocks: its one release, or a
    scoring of its kept releases."""
    return config.kind == "release" or post_processes_release(config)


def post_processes_release(config: SessionCreate) -> bool:
    """A scoring session with the models of a release session (the private sign design):
    each sender's share is its kept release's block (docs/privacy.md 3.8)."""
    return config.kind == "scoring" and config.model_kind == "release"


class PlanCache:
    """Session id -> plan, least recently used evicted; plans never change once created."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = capacity
        self._plans: OrderedDict[str, SessionPlan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str, load_json: Callable[[], str]) -> SessionPlan:
        with self._lock:
            plan = self._plans.get(session_id)
            if plan is not None:
                self._plans.move_to_end(session_id)
                return plan
        plan = SessionPlan.from_json(session_id, load_json())
        self.put(plan)
        return plan

    def put(self, plan: SessionPlan) -> None:
        with self._lock:
            self._plans[plan.session_id] = plan
            self._plans.move_to_end(plan.session_id)
            while len(self._plans) > self._capacity:
                self._plans.popitem(last=False)
