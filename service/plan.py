"""A session's fixed plan: its configuration plus everything derived from it (the pass schedule,
the output nodes of each pass, the layer widths). Immutable, so it is cached per session."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from secure.schedule import PassSpec, draw_output_batch, pass_schedule
from service.privacy import ReleaseAccounting
from service.schemas import PrivacySettings, SessionConfigView, SessionCreate

NoiseSource = Literal["given", "calibrated"]


@dataclass(frozen=True)
class SessionPlan:
    session_id: str
    config: SessionCreate  # privacy.noise_multiplier holds the z in use
    noise_multiplier_source: NoiseSource | None
    public_context_sha256: str | None
    epsilon_planned: float | None  # epsilon after every planned release
    passes: tuple[PassSpec, ...]
    widths: dict[int, int]
    eval_nodes: np.ndarray  # sorted int64

    @classmethod
    def build(
        cls,
        session_id: str,
        config: SessionCreate,
        *,
        noise_multiplier_source: NoiseSource | None = None,
        public_context_sha256: str | None = None,
        epsilon_planned: float | None = None,
    ) -> SessionPlan:
        return cls(
            session_id=session_id,
            config=config,
            noise_multiplier_source=noise_multiplier_source,
            public_context_sha256=public_context_sha256,
            epsilon_planned=epsilon_planned,
            passes=tuple(pass_schedule(rounds=config.rounds, eval_every=config.eval_every)),
            widths={a.layer: a.width for a in config.agg_layers},
            eval_nodes=np.sort(np.asarray(config.eval_nodes, dtype=np.int64)),
        )

    @classmethod
    def from_json(cls, session_id: str, text: str) -> SessionPlan:
        stored = json.loads(text)
        return cls.build(
            session_id,
            SessionCreate.model_validate(stored["config"]),
            noise_multiplier_source=stored["noise_multiplier_source"],
            public_context_sha256=stored["public_context_sha256"],
            epsilon_planned=stored["epsilon_planned"],
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "config": self.config.model_dump(mode="json"),
                "noise_multiplier_source": self.noise_multiplier_source,
                "public_context_sha256": self.public_context_sha256,
                "epsilon_planned": self.epsilon_planned,
            }
        )

    @property
    def clients(self) -> int:
        return self.config.clients

    @property
    def encoding(self) -> Literal["ckks", "float32"]:
        return self.config.encoding

    @property
    def privacy(self) -> PrivacySettings | None:
        return self.config.privacy

    @property
    def accounting(self) -> ReleaseAccounting | None:
        if self.config.privacy is None:
            return None
        return ReleaseAccounting(self.config.privacy, self.config.clients)

    @property
    def passes_total(self) -> int:
        return len(self.passes)

    @property
    def top_layer(self) -> int:
        return self.config.layers

    @property
    def first_agg_layer(self) -> int:
        return self.config.agg_layers[0].layer

    @property
    def last_agg_layer(self) -> int:
        return self.config.agg_layers[-1].layer

    def agg_layers_below(self, layer: int) -> list[int]:
        return [a.layer for a in self.config.agg_layers if a.layer < layer]

    def output_nodes(self, pass_index: int) -> np.ndarray:
        spec = self.passes[pass_index]
        if spec.kind == "eval":
            return self.eval_nodes
        return draw_output_batch(
            self.config.train_nodes,
            batch_size=self.config.batch_size,
            seed=self.config.seed,
            pass_index=pass_index,
        )

    def output_rows(self, pass_index: int) -> int:
        """len(output_nodes(pass_index)) without drawing the batch."""
        if self.passes[pass_index].kind == "eval":
            return int(self.eval_nodes.size)
        return min(self.config.batch_size, len(self.config.train_nodes))

    def config_view(self) -> SessionConfigView:
        fields = self.config.model_dump(exclude={"train_nodes", "eval_nodes"})
        return SessionConfigView(
            **fields,
            train_nodes_count=len(self.config.train_nodes),
            eval_nodes_count=len(self.config.eval_nodes),
            encoding=self.encoding,
            public_context_sha256=self.public_context_sha256,
        )


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
