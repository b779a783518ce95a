"""A lying service, fuzzed: seeded scenarios of lies told by a proxy (``lying_service.py``) in
front of the real ``glasu serve`` to a real ``glasu worker`` (the victim), and the owner's
guarantee checked from what actually crossed the wire, not from the worker's own records.

- A :class:`Scenario` is data: a seed, a tiny federation (two clients, DP on, 1-3 rounds,
  plaintext or CKKS shares), how the victim is supervised (restarts, checkpoint folders) and a
  list of :class:`Lie` drawn by a ``numpy`` Generator from the seed: which route (the session's
  description, a pass's plan, a union, a sum, an upload's answer), which run of the victim and
  which pass, which field, what rewrite. An "old session replayed" scenario first runs an
  honest session, then has the victim join a new session under the old one's id.
- :class:`FuzzService` is one ``glasu serve`` and one proxy for many scenarios (one session or
  two each); :meth:`FuzzService.run` plays a scenario (the honest peer talks to the service
  directly, the victim through the proxy; the victim is restarted like a Kubernetes Job after
  every non-zero exit while the scenario allows) and returns what the proxy captured.
- :func:`check` states the invariants over the capture and the owner's ledger file:

  (a) every distinct upload (a release is identified by its content: per configured session,
      pass and layer, each distinct body under plaintext shares; under CKKS, whose bodies are
      fresh encryptions, each slot) has its own row in the owner's ledger;
  (b) no two uploads share a noise draw: the noise dwarfs the clean rows, so two releases with
      independent noise are uncorrelated on their common rows, and two with one draw (at any
      scales) are correlated near 1;
  (c) the owner's epsilon (its ledger, as ``glasu budget`` reads it) is at least what an
      independent accountant (dp-accounting's RDP, used directly) computes over the captured
      releases, each at the noise multiplier its own spread shows among those the worker was
      told (under CKKS: each slot at the largest z it was told, a lower bound);
  (d) no release past the owner's caps crossed the wire, whatever the worker's exit code.

Run ``python tests/e2e/fuzz_kit.py --scenarios 50`` (from the repository root, ``PYTHONPATH=.``)
for a long run outside pytest; it prints each scenario's lies and findings and a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from lying_service import Exchange, lying_service, problem

from clients.admin import AdminClient
from clients.local.processes import (
    ManagedProcess,
    glasu_command,
    secret_file,
    start_process,
    start_serve,
    stop_all,
)
from clients.local.session import session_request, worker_arguments
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.config import TrainConfig
from models.data.partition import save_partition
from models.layout import layout_federation
from secure.privacy import SessionPrivacy
from secure.protocol import decode_nodes, encode_nodes

VICTIM, PEER = 1, 0
DELTA = 1e-6  # the owner's policy delta (worker_arguments: the run's)
EPSILON = 8.0  # the session's target, and the owner's per-session and lifetime caps
# (b): |correlation| of two releases' common rows above which they share a noise draw; with
# independent noise it is about var(clean) / sigma^2 (under 0.01 here), with one draw near 1
SHARED_DRAW_CORRELATION = 0.5
# (c): the independent accountant's RDP orders are not the project's: allow their difference
EPSILON_TOLERANCE = 5e-3
# (c): a plaintext release's spread must match sigma = z * Delta of a description it was told
SPREAD_TOLERANCE = 0.25
WORKER_SECONDS = 240.0  # one run of the victim; past it the scenario is a hang (a finding)
PEER_WAIT_SECONDS = 45.0

Route = Literal["session", "pass", "union", "aggregate", "embedding"]


# -- scenarios as data ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Lie:
    """One rewrite: on ``route``, in run ``attempt`` of the victim (0 the first; None every
    run), at pass ``pass_index`` (None: every pass), ``field`` becomes ``rewrite``."""

    route: Route
    attempt: int | None
    pass_index: int | None
    field: str
    rewrite: Any

    def applies(self, route: Route, attempt: int, pass_index: int | None) -> bool:
        return (
            self.route == route
            and self.attempt in (None, attempt)
            and (self.pass_index is None or self.pass_index == pass_index)
        )

    def __str__(self) -> str:
        when = "every run" if self.attempt is None else f"run {self.attempt}"
        where = "" if self.pass_index is None else f" pass {self.pass_index}"
        return f"{self.route}{where} ({when}): {self.field} -> {self.rewrite}"


@dataclass(frozen=True)
class Scenario:
    seed: int
    encryption: Literal["none", "ckks"]
    rounds: int  # passes: train 0 .. rounds-1, then one evaluation
    hidden: int
    restarts: int  # how many times the victim is started again after a non-zero exit
    checkpoint: Literal["none", "kept", "fresh"]  # --no-checkpoint, one folder, one per run
    accept_conflicts: bool  # a re-upload the real service refuses (409) is answered "created"
    alias_z_factor: float | None  # old session replayed: the new session's z over the old one's
    lies: tuple[Lie, ...]

    @property
    def passes_total(self) -> int:
        return self.rounds + 1

    @classmethod
    def draw(cls, seed: int, *, encryption: Literal["none", "ckks"] = "none") -> Scenario:
        """The scenario of ``seed``: the same seed always gives the same lies."""
        rng = np.random.default_rng(seed)
        rounds = int(rng.integers(1, 4))
        passes = rounds + 1
        restarts = int(rng.choice([0, 1, 2], p=[0.3, 0.5, 0.2]))
        checkpoint = str(rng.choice(["none", "kept", "fresh"], p=[0.6, 0.2, 0.2]))
        alias = float(rng.choice([1.0, 1.5, 2.0])) if rng.random() < 0.12 else None
        lies: list[Lie] = []
        if restarts and rng.random() < 0.85:  # a refusal that makes the supervisor restart it
            route = "aggregate" if rng.random() < 0.7 else "embedding"
            how = "409" if route == "aggregate" else str(rng.choice(["409", "409-unforwarded"]))
            lies.append(Lie(route, 0, int(rng.integers(0, passes)), "status", how))
        for attempt in range(1, restarts + 1):
            if checkpoint == "none" and rng.random() < 0.85:  # so that it may start over
                lies.append(Lie("session", attempt, None, "current_pass", 0))
        if restarts and rng.random() < 0.3:  # the restarted worker told another noise level
            factor = float(rng.choice([0.9, 1.5, 2.0, 4.0]))
            lies.append(Lie("session", int(rng.integers(1, restarts + 1)), None,
                            "noise_multiplier", factor))  # fmt: skip
        for _ in range(int(rng.integers(1, 4))):
            lies.append(_random_lie(rng, restarts=restarts, passes=passes))
        return cls(
            seed=seed,
            encryption=encryption,
            rounds=rounds,
            hidden=int(rng.choice([8, 16])),
            restarts=restarts,
            checkpoint=checkpoint,  # type: ignore[arg-type]
            accept_conflicts=bool(rng.random() < 0.85),
            alias_z_factor=alias,
            lies=tuple(lies),
        )

    def describe(self) -> str:
        head = (
            f"seed {self.seed}: {self.encryption}, {self.rounds} rounds, hidden {self.hidden}, "
            f"{self.restarts} restarts, checkpoint {self.checkpoint}, "
            f"{'accepts' if self.accept_conflicts else 'refuses'} conflicting re-uploads"
        )
        if self.alias_z_factor is not None:
            head += f", old session replayed with z x {self.alias_z_factor}"
        return "\n  ".join([head, *map(str, self.lies)])


SESSION_REWRITES: dict[str, Sequence[Any]] = {
    "noise_multiplier": (0.5, 0.9, 1.5, 2.0, 4.0),  # factors
    "clip": (0.5, 2.0, 10.0),
    "occurrence_cap": (-1, 1, 3),  # added
    "epsilon": (0.5, 2.0),
    "max_releases": (1, 2, 10),
    "delta": (10.0, 0.1),
    "accountant": ("prv",),
    "shared_noise": (True,),
    "passes_total": (-1, 1, 5),  # added
    "current_pass": (0, 1, 2, 5),
    "session_id": ("an-old-session",),
    "seed": (1, 7),  # added
    "reported": ("sensitivity", "ledger_noise_multiplier", "epsilon_planned"),  # x 1.5
    "unknown_field": ("config", "privacy"),  # where a field no model has goes
}  # "part_values" (rewrite_session) is told only by the malformed-answer tests: a name added
# here would redraw every seed's scenario, and the regression seeds name scenarios
# the mechanism's parameters are what the owner's guarantee hinges on: lie about them more often
SESSION_WEIGHTS = {"noise_multiplier": 4.0, "clip": 2.0, "occurrence_cap": 1.5}
PASS_REWRITES: dict[str, Sequence[Any]] = {
    "output_nodes": ("drop-one", "add-one", "replace", "empty"),
    "pass": (-1, 1),  # added
    "kind": ("swap", "done"),
}
UNION_REWRITES = ("add-one", "drop-one", "duplicate", "shuffle", "other-pass")
AGGREGATE_REWRITES = ("409", "scale", "truncate", "count")
EMBEDDING_REWRITES = ("409", "409-unforwarded")


def _random_lie(rng: np.random.Generator, *, restarts: int, passes: int) -> Lie:
    route = str(rng.choice(["session", "pass", "union", "aggregate", "embedding"],
                           p=[0.45, 0.15, 0.15, 0.15, 0.10]))  # fmt: skip
    attempt = int(rng.integers(0, restarts + 1)) if rng.random() < 0.8 else None
    pass_index = int(rng.integers(0, passes)) if rng.random() < 0.7 else None
    if route == "session":
        names = list(SESSION_REWRITES)
        weights = np.array([SESSION_WEIGHTS.get(n, 1.0) for n in names])
        name = str(rng.choice(names, p=weights / weights.sum()))
        choices = SESSION_REWRITES[name]
        return Lie("session", attempt, None, name, choices[int(rng.integers(len(choices)))])
    if route == "pass":
        name = str(rng.choice(list(PASS_REWRITES)))
        choices = PASS_REWRITES[name]
        rewrite = choices[int(rng.integers(len(choices)))]
        return Lie("pass", attempt, pass_index, name, rewrite)
    choices = {"union": UNION_REWRITES, "aggregate": AGGREGATE_REWRITES,
               "embedding": EMBEDDING_REWRITES}[route]  # fmt: skip
    rewrite = choices[int(rng.integers(len(choices)))]
    return Lie(route, attempt, pass_index, "nodes" if route == "union" else "body", rewrite)  # type: ignore[arg-type]


# -- what crossed the wire -----------------------------------------------------------------------


@dataclass(frozen=True)
class Upload:
    """One share (part) the victim sent, as the proxy received it."""

    attempt: int
    phase: str  # "new", or "old" for the honest session an "old session replayed" runs first
    session_id: str  # the session id in the victim's path: the one its owner configured
    pass_index: int
    layer: int
    part: int
    rows: int
    cols: int
    encoding: str
    body: bytes
    row_nodes: np.ndarray | None  # the last union served to the victim for this pass and layer

    def matrix(self) -> np.ndarray:
        return np.frombuffer(self.body, "<f4").reshape(self.rows, self.cols).astype(np.float64)


@dataclass(frozen=True)
class Told:
    """A session description the victim was served (after the lies): its privacy settings."""

    attempt: int
    phase: str
    session_id: str
    privacy: dict[str, Any] | None
    clients: int


@dataclass
class Capture:
    uploads: list[Upload] = field(default_factory=list)
    told: list[Told] = field(default_factory=list)
    lies_told: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    scenario: Scenario
    capture: Capture
    exit_codes: list[int | None]  # the victim's, run by run (None: hung, killed)
    ledger_path: Path
    sessions: list[str]  # the configured session ids, in order
    log_tail: str
    seconds: float


@dataclass(frozen=True)
class Finding:
    invariant: str  # "a" .. "d", "hang" or "crash"
    detail: str

    def __str__(self) -> str:
        return f"({self.invariant}) {self.detail}"


# -- the proxy's lies ----------------------------------------------------------------------------

_ROUTE = re.compile(
    r"^/v1/sessions/(?P<sid>[^/]+)"
    r"(?:/clients/(?P<client>\d+)/passes/(?P<pass>\d+)(?:/layers/(?P<layer>\d+)/(?P<what>\w+))?)?$"
)


class LyingHandler:
    """The proxy's handler for one scenario's victim: rewrites what ``lies`` say, captures
    every upload and every description served, and (alias) maps the configured session id to
    the session that really runs."""

    def __init__(
        self, scenario: Scenario, *, configured: str, real: str, num_nodes: int, phase: str = "new"
    ) -> None:
        self.scenario = scenario
        self.phase = phase
        self.configured, self.real = configured, real
        self.num_nodes = num_nodes
        self.attempt = 0
        self.capture = Capture()
        self._unions: dict[tuple[int, int], np.ndarray] = {}
        # what the real service answered before, for a replay it has discarded (a liar keeps it)
        self._answered: dict[tuple[str, str], httpx.Response] = {}
        self._lock = threading.Lock()

    def __call__(self, exchange: Exchange) -> httpx.Response:
        path = exchange.path.replace(f"/sessions/{self.configured}", f"/sessions/{self.real}", 1)
        exchange = dataclasses.replace(exchange, path=path)
        match = _ROUTE.match(path)
        if match is None:
            return exchange.forward()
        pass_index = None if match["pass"] is None else int(match["pass"])
        what = match["what"]
        if match["client"] is None and exchange.method == "GET":
            return self._session(exchange)
        if what is None and exchange.method == "GET":
            return self._pass(exchange, pass_index)
        if what == "nodes" and exchange.method == "GET":
            return self._union(exchange, pass_index, int(match["layer"]))
        if what == "nodes" and exchange.method == "PUT":
            return self._accepting(exchange, exchange.forward())
        if what == "embedding" and exchange.method == "PUT":
            return self._embedding(exchange, pass_index, int(match["layer"]))
        if what == "aggregate" and exchange.method == "GET":
            return self._aggregate(exchange, pass_index)
        return exchange.forward()

    def _lies(self, route: Route, pass_index: int | None) -> list[Lie]:
        lies = [x for x in self.scenario.lies if x.applies(route, self.attempt, pass_index)]
        with self._lock:
            self.capture.lies_told.extend(str(x) for x in lies)
        return lies

    @staticmethod
    def _json(answer: httpx.Response, body: Any) -> httpx.Response:
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
        return httpx.Response(
            answer.status_code, content=json.dumps(body).encode(), headers=headers
        )

    def _session(self, exchange: Exchange) -> httpx.Response:
        answer = exchange.forward()
        if answer.status_code != 200:
            return answer
        body = answer.json()
        body["session_id"] = self.configured  # the alias: the new session under the old id
        lies = self._lies("session", None)
        for lie in lies:
            rewrite_session(body, lie)
        if not any(x.field == "reported" for x in lies):
            consistent_report(body)  # a careful liar: the numbers agree with the lie
        config = body["config"]
        with self._lock:
            self.capture.told.append(
                Told(
                    self.attempt,
                    self.phase,
                    self.configured,
                    config.get("privacy"),
                    config["clients"],
                )
            )
        return self._json(answer, body)

    def _pass(self, exchange: Exchange, pass_index: int | None) -> httpx.Response:
        answer = exchange.forward()
        if answer.status_code != 200:
            return answer
        body = answer.json()
        rng = np.random.default_rng([self.scenario.seed, self.attempt, pass_index or 0])
        for lie in self._lies("pass", pass_index):
            if lie.field == "output_nodes" and body["kind"] != "done":
                body["output_nodes"] = rewrite_nodes(
                    np.asarray(body["output_nodes"]), lie.rewrite, rng, self.num_nodes
                ).tolist()
            elif lie.field == "pass":
                body["pass"] = max(0, body["pass"] + int(lie.rewrite))
            elif lie.field == "kind" and lie.rewrite == "done":
                body.update(kind="done", round=None, output_nodes=[], reason="finished")
            elif lie.field == "kind" and body["kind"] in ("train", "eval"):
                body["kind"] = "eval" if body["kind"] == "train" else "train"
        return self._json(answer, body)

    def _remembered(self, exchange: Exchange) -> httpx.Response:
        """The real service's answer, or (a replay after a restart) the one it gave before."""
        answer = exchange.forward()
        key = (exchange.path, exchange.query.split("&wait=")[0].split("wait=")[0])
        if answer.status_code == 200:
            self._answered[key] = answer
        elif answer.status_code == 409 and self.attempt > 0 and key in self._answered:
            return self._answered[key]
        return answer

    def _union(self, exchange: Exchange, pass_index: int | None, layer: int) -> httpx.Response:
        answer = self._remembered(exchange)
        if answer.status_code != 200 or pass_index is None:
            return answer
        union = decode_nodes(answer.content)
        rng = np.random.default_rng([self.scenario.seed, self.attempt, pass_index, 1])
        for lie in self._lies("union", pass_index):
            if lie.rewrite == "other-pass" and self._unions:
                union = next(iter(self._unions.values()))
            else:
                union = rewrite_nodes(union, lie.rewrite, rng, self.num_nodes)
        with self._lock:
            self._unions[(pass_index, layer)] = union
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
        return httpx.Response(200, content=encode_nodes(union), headers=headers)

    def _embedding(self, exchange: Exchange, pass_index: int | None, layer: int) -> httpx.Response:
        assert pass_index is not None
        rows, cols = (int(v) for v in exchange.headers.get("x-glasu-shape", "0,0").split(","))
        query = dict(q.split("=", 1) for q in exchange.query.split("&") if "=" in q)
        with self._lock:
            self.capture.uploads.append(
                Upload(
                    attempt=self.attempt,
                    phase=self.phase,
                    session_id=self.configured,
                    pass_index=pass_index,
                    layer=layer,
                    part=int(query.get("part", 0)),
                    rows=rows,
                    cols=cols,
                    encoding=exchange.headers.get("x-glasu-encoding", ""),
                    body=exchange.body,
                    row_nodes=self._unions.get((pass_index, layer)),
                )
            )
        lies = self._lies("embedding", pass_index)
        if any(x.rewrite == "409-unforwarded" for x in lies):
            return problem(409, "conflict", "this slot holds another share")
        answer = exchange.forward()
        if any(x.rewrite == "409" for x in lies):
            return problem(409, "conflict", "this slot holds another share")
        return self._accepting(exchange, answer)

    def _accepting(self, exchange: Exchange, answer: httpx.Response) -> httpx.Response:
        """A malicious service takes any re-upload the real one refuses as a conflict."""
        if answer.status_code != 409 or not self.scenario.accept_conflicts or self.attempt == 0:
            return answer
        match = _ROUTE.match(exchange.path)
        assert match is not None
        receipt = {"pass": int(match["pass"]), "layer": int(match["layer"]),
                   "client": int(match["client"]), "status": "created",
                   "received": [PEER, VICTIM], "missing": []}  # fmt: skip
        return httpx.Response(201, json=receipt)

    def _aggregate(self, exchange: Exchange, pass_index: int | None) -> httpx.Response:
        answer = self._remembered(exchange)
        if answer.status_code != 200:
            return answer
        content, headers = answer.content, dict(answer.headers)
        headers.pop("content-length", None)
        for lie in self._lies("aggregate", pass_index):
            if lie.rewrite == "409":
                return problem(409, "conflict", "this pass is being replayed")
            if lie.rewrite == "truncate":
                content = content[: len(content) // 2]
            elif lie.rewrite == "count":
                headers["x-glasu-count"] = "1"
            elif lie.rewrite == "scale" and self.scenario.encryption == "none":
                content = (np.frombuffer(content, "<f4") * 2).astype("<f4").tobytes()
        return httpx.Response(200, content=content, headers=headers)


def rewrite_session(body: dict[str, Any], lie: Lie) -> None:
    """Apply one session lie to ``GET /v1/sessions/{id}``'s body."""
    config, name, value = body["config"], lie.field, lie.rewrite
    privacy = config.get("privacy")
    if name == "session_id":
        body["session_id"] = value
    elif name == "current_pass":
        body["current_pass"] = int(value)
    elif name == "passes_total":
        body["passes_total"] = max(1, body["passes_total"] + int(value))
    elif name == "seed":
        config["seed"] = config["seed"] + int(value)
    elif name == "unknown_field":
        (privacy if value == "privacy" and privacy is not None else config)["surprise"] = 1
    elif name == "part_values":  # not drawn at random (see SESSION_REWRITES)
        config["part_values"] = int(value)
    elif privacy is None or name == "reported":
        if name == "reported":
            reported = body.get("privacy") or {}
            if isinstance(reported.get(value), int | float):
                reported[value] *= 1.5
    elif name in ("noise_multiplier", "clip", "epsilon", "delta"):
        if privacy.get(name) is not None:
            privacy[name] = (
                min(privacy[name] * float(value), 0.5)
                if name == "delta"
                else (privacy[name] * float(value))
            )
    elif name == "occurrence_cap":
        privacy[name] = max(0, int(privacy[name]) + int(value))
    elif name in ("max_releases", "accountant", "shared_noise"):
        privacy[name] = value


def consistent_report(body: dict[str, Any]) -> None:
    """Make the reported privacy numbers the ones the (rewritten) settings give, as a careful
    liar would (the worker refuses a session whose numbers differ from its own)."""
    config = body["config"]
    if not config.get("privacy"):
        return
    try:
        plan = SessionPrivacy.restore(
            config["privacy"],
            clients=config["clients"],
            passes_total=body["passes_total"],
            encrypted=config["encryption"] == "ckks",
        )
        numbers = {
            "sensitivity": plan.sensitivity,
            "ledger_noise_multiplier": plan.ledger_noise_multiplier,
            "epsilon_planned": plan.epsilon_planned,
            "noise_multiplier": plan.noise_multiplier,
        }
    except (ValueError, TypeError, ArithmeticError):
        return  # settings the worker will refuse anyway
    body.setdefault("privacy", {}).update(numbers)


def rewrite_nodes(
    nodes: np.ndarray, how: str, rng: np.random.Generator, num_nodes: int
) -> np.ndarray:
    nodes = np.asarray(nodes, dtype=np.int64)
    outside = np.setdiff1d(np.arange(num_nodes), nodes)
    if how == "drop-one" and len(nodes) > 1:
        return np.delete(nodes, int(rng.integers(len(nodes))))
    if how == "add-one" and len(outside):
        return np.sort(np.append(nodes, rng.choice(outside)))
    if how == "replace" and len(outside) >= len(nodes):
        return np.sort(rng.choice(outside, size=len(nodes), replace=False))
    if how == "empty":
        return nodes[:0]
    if how == "duplicate" and len(nodes):
        return np.sort(np.append(nodes, nodes[0]))
    if how == "shuffle":
        return rng.permutation(nodes)
    return nodes


# -- the invariants ------------------------------------------------------------------------------


def independent_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """Epsilon of Gaussian releases with these multipliers (sample rate 1), by dp-accounting's
    RDP accountant directly (a fine grid of orders of its own)."""
    if not noise_multipliers:
        return 0.0
    orders = sorted({*np.linspace(1.01, 2.0, 60), *np.geomspace(2.0, 4096.0, 400)})
    accountant = rdp_privacy_accountant.RdpAccountant(orders=orders)
    for z in noise_multipliers:
        accountant.compose(dp_event.GaussianDpEvent(noise_multiplier=float(z)))
    return float(accountant.get_epsilon(delta))


def told_noise(told: Told) -> tuple[float, float] | None:
    """(per-share noise std, the z an adversary holding the share faces) of a description the
    victim was told; None when it has no usable privacy. Delta = 2 C sqrt(c + 1)
    (docs/privacy.md), written out here rather than taken from the project."""
    p = told.privacy
    if not p or not isinstance(p.get("noise_multiplier"), int | float):
        return None
    try:
        z, clip, cap = float(p["noise_multiplier"]), float(p["clip"]), int(p["occurrence_cap"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (z > 0 and clip > 0 and cap >= 0):
        return None
    sigma = z * 2 * clip * math.sqrt(cap + 1)
    if p.get("shared_noise"):  # each share carries 1/M of the variance
        return sigma / math.sqrt(told.clients), z / math.sqrt(told.clients)
    return sigma, z


@dataclass(frozen=True)
class Release:
    """A distinct release among the captured uploads (part 0 identifies it)."""

    upload: Upload
    z: float | None  # the z it was noised with, as the wire shows it (None: matches none)


def distinct_releases(capture: Capture, encryption: str) -> list[Release]:
    """Each distinct release the victim sent. Plaintext: per (session, pass, layer), every
    distinct body of part 0, with the z of the description it was told whose noise its spread
    matches. CKKS (a fresh encryption of one plaintext has other bytes): per (session, pass,
    layer) and mechanism the run was told (z, clip, cap, shared noise: another mechanism is
    another release), with that z; a lower bound, since two releases of one slot under one
    mechanism look alike."""
    candidates = [(t, n) for t in capture.told if (n := told_noise(t)) is not None]
    releases: list[Release] = []
    seen: set[Any] = set()
    for upload in capture.uploads:
        if upload.part != 0:
            continue
        told = [(t, n) for t, n in candidates if t.session_id == upload.session_id]
        z = None
        if encryption == "ckks":
            run = [t for t, _ in told if (t.phase, t.attempt) == (upload.phase, upload.attempt)]
            mechanism = None if not run else mechanism_of(run[-1])
            key: Any = (upload.session_id, upload.pass_index, upload.layer, mechanism)
            z = None if not run else told_noise(run[-1])[1]  # type: ignore[index]
        else:
            key = (upload.session_id, upload.pass_index, upload.layer, upload.body)
            if upload.rows * upload.cols >= 16 and told:
                spread = float(upload.matrix().std())
                noises = [n for _, n in told]
                sigma, z_told = min(noises, key=lambda n: abs(math.log(spread / n[0])))
                if abs(math.log(spread / sigma)) <= math.log(1 + SPREAD_TOLERANCE):
                    z = z_told
        if key not in seen:
            seen.add(key)
            releases.append(Release(upload, z))
    return releases


def mechanism_of(told: Told) -> tuple[Any, ...]:
    p = told.privacy or {}
    return tuple(p.get(k) for k in ("noise_multiplier", "clip", "occurrence_cap", "shared_noise"))


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    """The owner's ledger's release rows, read without creating anything."""
    if not path.exists():
        return []
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        connection.row_factory = sqlite3.Row
        return [dict(r) for r in connection.execute("SELECT * FROM releases ORDER BY id")]
    finally:
        connection.close()


def owner_epsilon(path: Path, session_id: str | None = None) -> float:
    """The owner's epsilon as its ledger states it (the figure ``glasu budget`` reads)."""
    if not path.exists():
        return 0.0
    with OwnerLedger(path) as ledger:
        return ledger.epsilon(delta=DELTA, accountant="rdp", session_id=session_id)


def shared_draws(releases: Sequence[Release]) -> list[tuple[Upload, Upload, float]]:
    """Pairs of distinct plaintext releases whose common rows correlate like one noise draw."""
    found = []
    plain = [r.upload for r in releases if r.upload.rows * r.upload.cols > 0]
    for i, a in enumerate(plain):
        for b in plain[i + 1 :]:
            if a.cols != b.cols:
                continue
            if (
                a.row_nodes is not None
                and b.row_nodes is not None
                and (len(a.row_nodes) == a.rows and len(b.row_nodes) == b.rows)
            ):
                common, ia, ib = np.intersect1d(a.row_nodes, b.row_nodes, return_indices=True)
                if len(common) < 4:
                    continue
                x, y = a.matrix()[ia], b.matrix()[ib]
            elif a.rows == b.rows:
                x, y = a.matrix(), b.matrix()
            else:
                continue
            corr = float(np.corrcoef(x.ravel(), y.ravel())[0, 1])
            if abs(corr) > SHARED_DRAW_CORRELATION:
                found.append((a, b, corr))
    return found


def where(u: Upload) -> str:
    return f"{u.phase} run {u.attempt} {u.session_id[:8]} pass {u.pass_index} layer {u.layer}"


def check(outcome: Outcome) -> list[Finding]:
    """The invariants (module docstring) over one scenario's capture and the owner's ledger."""
    scenario, capture = outcome.scenario, outcome.capture
    findings: list[Finding] = []
    if None in outcome.exit_codes:
        findings.append(Finding("hang", f"the victim ran past {WORKER_SECONDS:.0f} s"))
    if "Traceback (most recent call last)" in outcome.log_tail:
        findings.append(Finding("crash", "the victim died on an unhandled exception"))
    releases = distinct_releases(capture, scenario.encryption)
    rows = ledger_rows(outcome.ledger_path)
    # (a) every distinct release has its own row
    slots: dict[tuple[str, int, int], int] = {}
    for r in releases:
        key = (r.upload.session_id, r.upload.pass_index, r.upload.layer)
        slots[key] = slots.get(key, 0) + 1
    for (sid, p, layer), count in sorted(slots.items()):
        recorded = sum(
            1 for row in rows
            if (row["session_id"], row["pass_index"], row["layer"]) == (sid, p, layer)
        )  # fmt: skip
        if recorded < count:
            findings.append(Finding(
                "a", f"session {sid[:8]} pass {p} layer {layer}: {count} distinct releases"
                f" crossed the wire, the owner's ledger has {recorded} rows",
            ))  # fmt: skip
    # (b) no two releases share a noise draw
    if scenario.encryption == "none":
        for a, b, corr in shared_draws(releases):
            findings.append(Finding(
                "b", f"{where(a)} and {where(b)}: one noise draw (correlation {corr:.4f} on"
                " their common rows)",
            ))  # fmt: skip
    # (c) the owner's epsilon covers the captured releases; (d) none past the caps
    unmatched = [r for r in releases if r.z is None]
    for r in unmatched:
        findings.append(Finding(
            "c", f"{where(r.upload)}: a release whose noise matches no z the worker was told",
        ))  # fmt: skip
    zs = [r.z for r in releases if r.z is not None]
    lifetime = independent_epsilon(zs, DELTA)
    owner = owner_epsilon(outcome.ledger_path)
    if owner < lifetime * (1 - EPSILON_TOLERANCE):
        findings.append(Finding(
            "c", f"the owner's ledger says epsilon {owner:.4f} ({len(rows)} rows); the"
            f" {len(zs)} releases on the wire spend {lifetime:.4f}",
        ))  # fmt: skip
    cap = EPSILON * (1 + EPSILON_TOLERANCE)
    if lifetime > cap:
        findings.append(Finding(
            "d", f"releases past the owner's caps crossed the wire: epsilon {lifetime:.4f} over"
            f" {len(zs)} releases, caps {EPSILON} (exit codes {outcome.exit_codes})",
        ))  # fmt: skip
    return findings


# -- the driver ----------------------------------------------------------------------------------


def train_config(scenario: Scenario) -> TrainConfig:
    return TrainConfig(
        clients=2, rounds=scenario.rounds, eval_every=0, hidden=scenario.hidden,
        encryption=scenario.encryption, dp=True, epsilon=EPSILON, seed=5, device="cpu",
    )  # fmt: skip


class FuzzService:
    """One real ``glasu serve`` (with a CKKS public context) and one lying proxy in front of
    it, for many scenarios in turn."""

    def __init__(self, root: Path, dataset: Any) -> None:
        self.root = root
        self.dataset = dataset
        self.processes: list[ManagedProcess] = []
        self._stack = ExitStack()
        self.handler: LyingHandler | None = None

    def __enter__(self) -> FuzzService:
        from secure.ckks import generate_keys

        self.secret_context, public_context = generate_keys(self.root / "keys")
        served = start_serve(
            self.root, admin_token=secrets.token_urlsafe(32),
            extra_args=["--public-context", str(public_context)],
        )  # fmt: skip
        self.processes.append(served.managed)
        served.wait_healthy()
        self.url = served.url
        self.admin = AdminClient(base_url=served.url, token=served.admin_token)
        self._stack.callback(stop_all, self.processes)
        self.proxy = self._stack.enter_context(lying_service(served.url, self._dispatch))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _dispatch(self, exchange: Exchange) -> httpx.Response:
        if self.handler is None:
            return problem(503, "unavailable", "no scenario is running")
        return self.handler(exchange)

    def run(self, scenario: Scenario) -> Outcome:
        started = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix=f"seed{scenario.seed}-", dir=self.root))
        config = train_config(scenario)
        layout = layout_federation(config, self.dataset)
        data = {p.client: save_partition(p, root / "partitions") for p in layout.partitions}
        ledger_path = root / "owner" / LEDGER_FILENAME  # the one the owner names (--ledger)
        sessions: list[str] = []
        codes: list[int | None] = []
        capture = Capture()
        workers: list[ManagedProcess] = []
        try:
            old_session = None
            if scenario.alias_z_factor is not None:  # an honest session first, finished
                old = self._create(config, layout)
                handler = LyingHandler(
                    dataclasses.replace(scenario, lies=()), configured=old["session_id"],
                    real=old["session_id"], num_nodes=self.dataset.num_nodes, phase="old",
                )  # fmt: skip
                self.handler = handler
                codes += self._play(
                    config,
                    old,
                    handler,
                    data,
                    root,
                    ledger_path,
                    workers,
                    scenario=dataclasses.replace(scenario, restarts=0),
                    tag="old",
                )
                capture = handler.capture
                sessions.append(old["session_id"])
                old_session = old["session_id"]
            created = self._create(config, layout, z_factor=scenario.alias_z_factor)
            configured = old_session or created["session_id"]
            handler = LyingHandler(
                scenario, configured=configured, real=created["session_id"],
                num_nodes=self.dataset.num_nodes,
            )  # fmt: skip
            handler.capture = capture
            self.handler = handler
            if old_session is None:
                sessions.append(configured)
            codes += self._play(
                config,
                created,
                handler,
                data,
                root,
                ledger_path,
                workers,
                scenario=scenario,
                tag="new",
                configured=configured,
            )
        finally:
            self.handler = None
            stop_all(workers)
        log = "\n".join(w.log_text() for w in workers if w.name.startswith("victim"))
        outcome = Outcome(scenario, capture, codes, ledger_path, sessions, log[-20000:],
                          time.monotonic() - started)  # fmt: skip
        return outcome

    def _create(self, config: TrainConfig, layout: Any, z_factor: float | None = None) -> dict:
        request = session_request(config, layout, self.dataset)
        if z_factor is not None and z_factor != 1.0:
            plan = config.session_privacy(clients=2, passes_total=config.rounds + 1)
            assert plan is not None
            request["privacy"] = {**request["privacy"],
                                  "noise_multiplier": plan.noise_multiplier * z_factor}  # fmt: skip
        return self.admin.create_session(request)

    def _play(
        self, config: TrainConfig, created: dict, handler: LyingHandler, data: dict[int, Path],
        root: Path, ledger_path: Path, workers: list[ManagedProcess], *, scenario: Scenario,
        tag: str, configured: str | None = None,
    ) -> list[int | None]:  # fmt: skip
        """Run the peer (direct) and the victim (through the proxy, restarted after each
        non-zero exit while ``scenario.restarts`` allows) in one session; the victim's exit
        codes. The peer is stopped once the victim is done."""
        sid = created["session_id"]
        tokens = created["client_tokens"]

        def command(client: int, server: str, session: str, attempt: int) -> list[str]:
            args = worker_arguments(
                config, server=server, session_id=session, client=client,
                token_file=secret_file(root / f"{tag}-client-{client}.token", tokens[client]),
                data=data[client], result=root / f"{tag}-client-{client}-{attempt}.json",
                secret_context=self.secret_context if scenario.encryption == "ckks" else None,
                threads=1, passes_total=created["passes_total"],
            )  # fmt: skip
            args += ["--peer-wait-seconds", str(PEER_WAIT_SECONDS), "--poll-seconds", "10"]
            if client == VICTIM:
                args += ["--ledger", str(ledger_path)]
            if client != VICTIM or scenario.checkpoint == "none":
                args.append("--no-checkpoint")
            else:
                folder = "checkpoints" if scenario.checkpoint == "kept" else f"ckpt-{attempt}"
                args += ["--checkpoint", str(root / f"{tag}-{folder}")]
            return glasu_command(*args)

        # the peer's own data folder per session: its ledger is not the victim's concern
        peer_data = data[PEER].parent.parent / f"peer-{tag}" / data[PEER].name
        if not peer_data.exists():
            shutil.copytree(data[PEER], peer_data)
        data = {**data, PEER: peer_data}
        peer = start_process(f"peer-{tag}", command(PEER, self.url, sid, 0),
                             root / f"{tag}-peer.log")  # fmt: skip
        workers.append(peer)
        codes: list[int | None] = []
        for attempt in range(scenario.restarts + 1):
            handler.attempt = attempt
            victim = start_process(
                f"victim-{tag}-{attempt}",
                command(VICTIM, self.proxy, configured or sid, attempt),
                root / f"{tag}-victim-{attempt}.log",
            )
            workers.append(victim)
            try:
                code: int | None = victim.process.wait(timeout=WORKER_SECONDS)
            except Exception:  # subprocess.TimeoutExpired: a hang
                code = None
                stop_all([victim])
            codes.append(code)
            if code == 0 or code is None:
                break
        if tag == "old":  # the honest session must finish for the replay to mean anything
            peer.process.wait(timeout=WORKER_SECONDS)
        stop_all([peer])
        return codes


@contextmanager
def fuzz_service(dataset: Any, root: Path) -> Iterator[FuzzService]:
    """A :class:`FuzzService` under ``root`` (its logs, keys, database and scenarios' folders)."""
    with FuzzService(root, dataset) as service:
        yield service


def scenario_for(seed: int) -> Scenario:
    """The seed's scenario: one seed in ten has CKKS shares."""
    return Scenario.draw(seed, encryption="ckks" if seed % 10 == 9 else "none")


def run_seeds(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The driver's scenarios, one after the other on one service, each printed as it ends."""
    from models.data.planetoid import load_dataset

    shutil.copytree(args.data_dir / "Cora", work / "data" / "Cora")
    dataset = load_dataset("cora", data_dir=work / "data", split="paper", seed=0)
    results = []
    with fuzz_service(dataset, work) as service:
        for seed in range(args.first_seed, args.first_seed + args.scenarios):
            scenario = scenario_for(seed)
            outcome = service.run(scenario)
            findings = check(outcome)
            print(scenario.describe(), flush=True)
            print(f"  -> exits {outcome.exit_codes}, {len(outcome.capture.uploads)} uploads,"
                  f" {outcome.seconds:.1f} s", flush=True)  # fmt: skip
            for f in findings:
                print(f"  !! {f}", flush=True)
            results.append({"seed": seed, "seconds": outcome.seconds,
                            "exit_codes": outcome.exit_codes,
                            "uploads": len(outcome.capture.uploads),
                            "findings": [dataclasses.asdict(f) for f in findings]})  # fmt: skip
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    shared = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "planetoid"
    parser.add_argument("--data-dir", type=Path, default=shared)
    parser.add_argument("--json", type=Path, default=None, help="write every outcome here")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="glasu-fuzz-"))
    try:
        results = run_seeds(args, work)
    finally:
        if args.keep:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    found = [r for r in results if any(f["invariant"] in "abcd" for f in r["findings"])]
    total = sum(r["seconds"] for r in results)
    print(f"{len(results)} scenarios in {total:.0f} s ({total / max(len(results), 1):.1f} s each);"
          f" {len(found)} broke an invariant: {[r['seed'] for r in found]}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
