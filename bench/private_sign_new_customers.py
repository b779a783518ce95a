"""New customers scored with a kept private sign model (models/private_sign_kept.py), against
the same customers had they been in the training's release, and the label holder alone.

On the differing family of bench/model_at_scale.py (a sparse label holder, two dense partners),
a share ``--new`` of the nodes are customers added after the training: the training's tables
lack them (their rows, and every edge that touches them). Each partner releases once over its
training table; the label holder trains its head on that release. Then the tables gain the new
customers, and each partner hands on its block from its KEPT release alone (a new customer's row
filled from its covered neighbours; no new release), and the label holder's kept head scores
them. Compared on the new customers:

- **kept release (scoring)**: what ``glasu score`` gives for a private sign model;
- **in the release**: the same design trained on the current tables (the new customers in the
  release), its accuracy on them: what a fresh training would give, at a second release;
- **party alone**: the label holder's own sign head, on its current table.

    python -m bench.private_sign_new_customers --nodes 20000 --seeds 3 --epsilons 1,4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.model_at_scale import DIFFERING_DEGREES, DIFFERING_OVERLAP, Graph
from bench.results_doc import single_thread, write_json
from models.config import TrainConfig
from models.data.partition import ClientPartition
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.layout import layout_federation
from models.private import noise_source
from models.private_sign import (
    beside,
    make_receiver,
    received_hops,
    receiver_config,
    receiver_outcome,
    release_settings,
    released_block,
    senders,
    sign_privacy,
)
from models.private_sign_kept import kept_block
from models.recipe import choose_recipe
from secure.aggregation import PlainSumAggregator
from secure.schedule import SessionSchedule

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "private_sign_new_customers.json"
CPU = torch.device("cpu")


def without(part: ClientPartition, new: np.ndarray) -> ClientPartition:
    """The training's table: the new customers' rows zero and every edge that touches them
    gone (the aligned indexing kept, so that rows line up with the current table's)."""
    is_new = np.zeros(part.num_nodes, dtype=bool)
    is_new[new] = True
    src, dst = part.edge_index.numpy()
    kept_edges = ~(is_new[src] | is_new[dst])
    features = part.feature_rows(np.arange(part.num_nodes)).clone()  # in aligned order
    features[torch.from_numpy(new)] = 0.0
    return dataclasses.replace(
        part,
        features=features,
        rows_of_nodes=None,
        edge_index=part.edge_index[:, torch.from_numpy(kept_edges)],
        # not held: left out of the scaling statistics, as a table without them would be
        held=~is_new if part.held is None else part.held & ~is_new,
        train_nodes=np.setdiff1d(part.train_nodes, new),
        val_nodes=np.setdiff1d(part.val_nodes, new),
        test_nodes=new,
    )


def config_of(graph: Graph, joined: Any, epsilon: float) -> TrainConfig:
    """What ``glasu train --backbone sign`` runs under DP at ``epsilon`` (the recipe's sign)."""
    config = TrainConfig(
        dataset=joined.name, seed=graph.seed, clients=3, dp=True, epsilon=epsilon, delta=1e-6,
        encryption="none", device="cpu", label_holder=graph.label_holder, backbone="sign",
    )  # fmt: skip
    recipe = choose_recipe(backbone="sign", labelled=len(joined.train_nodes), private=True)
    config, _ = recipe.apply(config, given=["--backbone", "--epsilon", "--delta"])
    return config


def train_head(receiver: Any, config: TrainConfig, part: ClientPartition) -> None:
    """The receiver's rounds (as clients/sign_session.py runs them); its head and its
    party-alone reference each left at their best validation round (what a model keeps)."""
    schedule = SessionSchedule.create(
        rounds=config.rounds, eval_every=config.eval_every, train_nodes=part.train_nodes,
        eval_nodes=np.union1d(part.val_nodes, part.test_nodes), batch_size=config.batch_size,
        seed=config.seed,
    )  # fmt: skip
    best = {"head": (-1.0, None), "alone": (-1.0, None)}
    for spec in schedule.passes:
        outcome = receiver_outcome(
            receiver, pass_index=spec.index, kind=spec.kind,
            output_nodes=schedule.output_nodes(spec.index),
        )  # fmt: skip
        if spec.kind != "eval":
            continue
        for name, client, val in (
            ("head", receiver.client, outcome.val_accuracy),
            ("alone", receiver.reference, outcome.reference_val_accuracy),
        ):
            if val > best[name][0]:
                state = {k: v.clone() for k, v in client.network.state_dict().items()}
                best[name] = (val, state)
    for name, client in (("head", receiver.client), ("alone", receiver.reference)):
        client.network.load_state_dict(best[name][1])


def accuracy_on(client: GlasuClient, nodes: np.ndarray) -> float:
    """The client's test accuracy on ``nodes`` (its partition's test nodes), one evaluation."""
    outcome = run_pass_inprocess(
        [client], PlainSumAggregator(), pass_index=0, kind="eval", output_nodes=nodes
    )[0]
    return float(outcome.test_accuracy)


def run(graph: Graph, epsilon: float, share: float) -> dict[str, Any]:
    joined, parts = graph.load()
    rng = np.random.default_rng(graph.seed + 17)
    new = np.sort(rng.choice(joined.num_nodes, size=int(share * joined.num_nodes), replace=False))
    new = np.setdiff1d(new, joined.train_nodes)  # the labels the training had stay old
    config = config_of(graph, joined, epsilon)
    layout = layout_federation(config, joined, partitions=parts)
    current = layout.partitions
    training = [without(p, new) for p in current]
    privacy = sign_privacy(config, clients=len(current))
    local = receiver_config(layout.client_config)
    holder = graph.label_holder
    assert holder is not None
    width, hops = config.release_width, config.hops
    kept, trained_blocks, fresh_blocks = {}, [], []
    for m in senders(current, holder):
        release = release_settings(privacy, width=width, seed=config.seed, party=m)
        noise = noise_source(noise_seed=config.noise_seed, client=m)
        block = released_block(training[m], release, hops=hops, noise=noise, seed=config.seed)
        kept[m] = block.hops[0]
        trained_blocks.append(block)
        fresh = noise_source(noise_seed=config.noise_seed, client=m)
        fresh_blocks.append(
            released_block(current[m], release, hops=hops, noise=fresh, seed=config.seed)
        )
    covered = np.ones(joined.num_nodes, dtype=bool)
    covered[new] = False
    scored_blocks = [kept_block(kept[m], covered, current[m], hops=hops) for m in kept]

    def received(blocks: list[Any]) -> Any:
        return received_hops(blocks, num_nodes=joined.num_nodes, width=width, hops=hops)

    now = dataclasses.replace(current[holder], test_nodes=new, clients=1)
    # the model: trained on the training's tables, then scoring on the current ones
    trained = make_receiver(training[holder], local, received(trained_blocks), device=CPU)
    train_head(trained, config, training[holder])
    scored = received(scored_blocks)

    def scoring_on(nodes: np.ndarray) -> float:
        """The kept head on the current tables, scoring ``nodes``."""
        table = dataclasses.replace(now, test_nodes=nodes)
        own = GlasuClient(table, local, device=CPU).hop_features
        assert own is not None
        client = GlasuClient(table, local, device=CPU, hop_features=beside(own, scored))
        client.network.load_state_dict(trained.client.network.state_dict())
        return accuracy_on(client, nodes)

    # the same customers in the release: trained on the current tables
    fresh = make_receiver(now, local, received(fresh_blocks), device=CPU)
    train_head(fresh, config, now)
    return {
        "new_customers": int(new.size),
        "kept release (scoring)": scoring_on(new),
        # the training's own test customers, scored the same way (the pipeline's check)
        "kept release, old test customers": scoring_on(np.setdiff1d(joined.test_nodes, new)),
        "in the release": accuracy_on(fresh.client, new),
        "party alone": accuracy_on(fresh.reference, new),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--epsilons", default="4")
    parser.add_argument("--new", type=float, default=0.1, help="share of new customers")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    single_thread()
    payload = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    for seed in range(args.seeds):
        graph = Graph("differing", args.nodes, seed, DIFFERING_DEGREES, DIFFERING_OVERLAP)
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            started = time.process_time()
            row = {"nodes": args.nodes, "seed": seed, "epsilon": epsilon, "new": args.new,
                   **run(graph, epsilon, args.new)}  # fmt: skip
            row["cpu_s"] = round(time.process_time() - started, 1)
            payload["runs"].append(row)
            write_json(args.out, payload)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
