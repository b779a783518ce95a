"""What encryption alone leaves exposed: an attribute-inference attack by a curious peer.

Encryption keeps the shares from the service, not from the peers: every worker holds the secret
key, decrypts every sum and can subtract its own share; what remains is the other parties'
contribution, computed from their features. This bench gives the attacker that view of the
layer-1 release of the product's private arrangement (the fixed map
``clip_C(A_hat normalize(X_m) P_m)`` of models/private.py, A_hat the mean over the victim's own
edges, the 80% sample of models/data/partition.py, with self-loops; the public projection seed),
with no noise ("encryption only") and with the noise the product adds at epsilon 1, 2, 4, 8, 16
(delta 1e-6, RDP, unshared noise, the releases of a default run: 300 rounds, an evaluation every
20). The attacker is granted every one of the R releases of every node and averages them, which
the accounting allows for: R releases at multiplier z are one release at z / sqrt(R). Without
DP the product trains plain GLASU, whose shares are trained layer-2 embeddings instead of this
fixed map: that view is not measured here.

The attacker knows the victim's features for half the nodes (e.g. shared customers), trains an
inversion model (an MLP, view -> the victim's feature block), and predicts the block of the
other half. Reported: the mean AUC over the victim's binary features that occur in the test half
(0.5 = no information; the attacker's prior alone gives 0.5), for M = 2 (the attacker sees the
victim's release alone) and M = 3 (the victim's release summed with the third party's).

    python -m bench.attribute_inference [--datasets cora,citeseer] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from models.config import TrainConfig
from models.data.partition import partition
from models.data.planetoid import GraphDataset, load_dataset
from models.private import release_projection_seed
from secure.dp import clip_rows
from secure.privacy import SessionPrivacy
from secure.schedule import pass_schedule

ROOT = Path(__file__).resolve().parents[1]

EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0)
DEFAULTS = TrainConfig()
RELEASES = len(pass_schedule(rounds=DEFAULTS.rounds, eval_every=DEFAULTS.eval_every))
WIDTH, CLIP, CAP, DELTA = DEFAULTS.release_width, DEFAULTS.clip, 1, DEFAULTS.delta
OUT = ROOT / "bench" / "results" / "attribute_inference.json"


def normalized_adjacency(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Mean over each node's neighbours and itself (the release layer's aggregation)."""
    loops = torch.arange(num_nodes)
    rows = torch.cat([edge_index[0], loops])
    cols = torch.cat([edge_index[1], loops])
    degree = torch.bincount(rows, minlength=num_nodes).float()
    values = 1.0 / degree[rows]
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (num_nodes, num_nodes))


def release(
    features: torch.Tensor, adjacency: torch.Tensor, *, seed: int, client: int
) -> np.ndarray:
    generator = torch.Generator().manual_seed(release_projection_seed(seed=seed, client=client))
    projection = torch.randn(features.shape[1], WIDTH, generator=generator) / WIDTH**0.5
    normalized = features / features.norm(dim=1, keepdim=True).clamp_min(1e-12)
    mapped = torch.sparse.mm(adjacency, normalized @ projection).numpy()
    return clip_rows(mapped, clip=CLIP)


def auc(scores: np.ndarray, truth: np.ndarray) -> float:
    """Mean AUC over the columns with both classes (Mann-Whitney U with average ranks)."""
    values = []
    for j in range(truth.shape[1]):
        positives = truth[:, j] > 0
        n_pos, n_neg = int(positives.sum()), int((~positives).sum())
        if n_pos == 0 or n_neg == 0:
            continue
        ranks = np.argsort(np.argsort(scores[:, j], kind="mergesort"), kind="mergesort") + 1.0
        values.append((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return float(np.mean(values))


def attack(view: np.ndarray, target: np.ndarray, *, known: np.ndarray, seed: int) -> float:
    torch.manual_seed(seed)
    x = torch.from_numpy(view).float()
    x = (x - x[known].mean(0)) / x[known].std(0).clamp_min(1e-6)
    y = torch.from_numpy((target > 0).astype(np.float32))
    model = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], 128), torch.nn.ReLU(), torch.nn.Linear(128, y.shape[1])
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    train = torch.from_numpy(known)
    for _ in range(300):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[train]), y[train])
        loss.backward()
        optimizer.step()
    unknown = np.setdiff1d(np.arange(len(view)), known)
    with torch.no_grad():
        scores = model(x[torch.from_numpy(unknown)]).numpy()
    return auc(scores, target[unknown])


def noise_levels(*, clients: int, epsilons: tuple[float, ...] = EPSILONS) -> dict[str, float]:
    """Noise std of the attacker's averaged view of one party's release, per setting."""
    sensitivity = 2 * CLIP * math.sqrt(CAP + 1)
    noise = {"encryption only": 0.0}
    for epsilon in epsilons:
        plan = SessionPrivacy.plan(
            epsilon=epsilon, delta=DELTA, clip=CLIP, occurrence_cap=CAP,
            clients=clients, passes_total=RELEASES, encrypted=True,
        )  # fmt: skip
        noise[f"epsilon {epsilon:g}"] = plan.noise_multiplier / math.sqrt(RELEASES) * sensitivity
    return noise


def measure(
    dataset: GraphDataset, *, clients: int, seed: int, epsilons: tuple[float, ...]
) -> dict[str, float]:
    """AUC of client 1's inversion of client 0's feature block, per noise setting."""
    parts = partition(dataset, clients=clients, seed=seed)
    releases = [
        release(p.features, normalized_adjacency(p.edge_index, p.num_nodes), seed=seed, client=m)
        for m, p in enumerate(parts)
    ]
    victim = parts[0].features.numpy()
    rng = np.random.default_rng(seed)
    known = np.sort(rng.choice(dataset.num_nodes, dataset.num_nodes // 2, replace=False))
    scores = {}
    for label, std in noise_levels(clients=clients, epsilons=epsilons).items():
        # what the attacker (client 1) keeps: the sum minus its own share
        others = [r for m, r in enumerate(releases) if m != 1]
        view = sum(r + rng.normal(0.0, std, r.shape) for r in others)
        scores[label] = attack(view, victim, known=known, seed=seed)
    return scores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="cora,citeseer")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--clients", default="2,3")
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets/planetoid"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    epsilons = tuple(float(e) for e in args.epsilons.split(","))
    started = time.process_time()
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "planetoid"
        shutil.copytree(args.data_dir, data_dir, copy_function=shutil.copyfile)
        for path in [data_dir, *data_dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        for name in args.datasets.split(","):
            dataset = load_dataset(name, data_dir=data_dir, seed=0)
            for clients in (int(m) for m in args.clients.split(",")):
                for seed in range(args.seeds):
                    for label, score in measure(
                        dataset, clients=clients, seed=seed, epsilons=epsilons
                    ).items():
                        cell = results.setdefault(name, {}).setdefault(f"M={clients}", {})
                        cell.setdefault(label, []).append(score)
                        print(
                            f"{name} M={clients} seed {seed} {label}: AUC {score:.3f}", flush=True
                        )
    summary = {
        "attack": "client 1 decrypts each sum, subtracts its own share, averages all releases, "
        "trains an MLP (view -> client 0's binary feature block) on a random half of the nodes "
        "and scores the other half; mean AUC over the features present there; 0.5 = no "
        "information",
        "releases": RELEASES,
        "seeds": args.seeds,
        "noise_std_of_the_averaged_view": {
            f"M={m}": noise_levels(clients=int(m), epsilons=epsilons)
            for m in args.clients.split(",")
        },
        "auc": {
            name: {
                m: {
                    k: [round(float(np.mean(v)), 3), round(float(np.std(v)), 3)]
                    for k, v in r.items()
                }
                for m, r in by_m.items()
            }
            for name, by_m in results.items()
        },
        "per_seed": results,
        "cpu_seconds": round(time.process_time() - started, 1),
    }
    print(json.dumps(summary["auc"], indent=2))
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
