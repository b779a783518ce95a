"""What encryption alone leaves exposed: an attribute-inference attack by a curious peer.

In a session without differential privacy a peer decrypts every sum and subtracts its own
share: what remains is the other parties' contribution, computed from their features. This bench
gives the attacker that view of the layer-1 release of the product's private arrangement (the
fixed map ``clip_C(A_hat normalize(X_m) P_m)`` of models/private.py, over the victim's own
edges), with no noise ("encryption only") and with the noise the product adds at epsilon 1, 2,
4, 8, 16 (delta 1e-6, unshared noise, the default run's 330 releases). The attacker is granted
every one of the R releases of every node and averages them, which the accounting allows for:
R releases at multiplier z are one release at z / sqrt(R).

The attacker knows the victim's features for half the nodes (e.g. shared customers), trains an
inversion model (an MLP, view -> the victim's feature block), and predicts the block of the
other half. Reported: the mean AUC over the victim's binary features that occur in the test half
(0.5 = no information; the attacker's prior alone gives 0.5), for M = 2 (the attacker sees the
victim's release alone) and M = 3 (the victim's release summed with the third party's).

    python bench/attribute_inference.py [--dataset cora] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.data import load_dataset  # noqa: E402
from models.partition import feature_blocks  # noqa: E402
from models.private import release_projection_seed  # noqa: E402
from secure.dp import clip_rows  # noqa: E402
from secure.privacy import SessionPrivacy  # noqa: E402

EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0)
RELEASES = 330  # the default run: 300 rounds, an evaluation every 10
WIDTH, CLIP, CAP, DELTA = 16, 1.0, 1, 1e-6
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    args = parser.parse_args()
    dataset = load_dataset(args.dataset, data_dir=Path(args.data_dir), seed=0)
    adjacency = normalized_adjacency(dataset.edge_index, dataset.num_nodes)
    sensitivity = 2 * CLIP * math.sqrt(CAP + 1)
    noise = {"no noise (encryption only)": 0.0}
    for epsilon in EPSILONS:
        plan = SessionPrivacy.plan(
            epsilon=epsilon, delta=DELTA, clip=CLIP, occurrence_cap=CAP,
            clients=3, passes_total=RELEASES, encrypted=True,
        )  # fmt: skip
        # the averaged view of R releases: one release at z / sqrt(R)
        noise[f"epsilon {epsilon:g}"] = plan.noise_multiplier / math.sqrt(RELEASES) * sensitivity
    results: dict[str, dict[str, list[float]]] = {}
    for clients in (2, 3):
        for seed in range(args.seeds):
            blocks = feature_blocks(dataset.features.shape[1], clients=clients, seed=seed)
            releases = [
                release(dataset.features[:, torch.from_numpy(b)], adjacency, seed=seed, client=m)
                for m, b in enumerate(blocks)
            ]
            victim = dataset.features[:, torch.from_numpy(blocks[0])].numpy()
            rng = np.random.default_rng(seed)
            known = np.sort(rng.choice(dataset.num_nodes, dataset.num_nodes // 2, replace=False))
            for label, std in noise.items():
                # what the attacker (client 1) keeps: the sum minus its own share
                others = [r for m, r in enumerate(releases) if m != 1]
                view = sum(r + rng.normal(0.0, std, r.shape) for r in others)
                score = attack(view, victim, known=known, seed=seed)
                results.setdefault(f"M={clients}", {}).setdefault(label, []).append(score)
                print(f"M={clients} seed {seed} {label}: AUC {score:.3f}", flush=True)
    summary = {
        "dataset": args.dataset,
        "releases": RELEASES,
        "noise_std_of_the_averaged_view": noise,
        "auc": {
            m: {k: [round(float(np.mean(v)), 3), round(float(np.std(v)), 3)] for k, v in r.items()}
            for m, r in results.items()
        },
    }
    print(json.dumps(summary, indent=2))
    OUT.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
