"""Straggler policies measured: what "continue" costs in accuracy and saves in time against
"wait" when one of three parties is late again and again.

Three real workers and the real service app in one process (the ASGI transport, no sockets),
Cora, plaintext sums and no DP (to see the policy alone). Client 2 stalls before its first share
in every ``--every``-th pass it takes part in, for ``--stall`` seconds (a paused process, a
broken link).
Under "wait" the others wait for it; under "continue" a layer closes ``--wait`` seconds after its
first share without it, and it rejoins at a later pass. "no stall" is the same session with
nobody late. Reported: client 0's final test accuracy, the passes client 2 missed, wall time.

    python -m bench.stragglers --seeds 0 1
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bench.results_doc import (
    add_results_arguments,
    load_copied,
    rewrote_docs_only,
    single_thread,
    write_json,
    write_section,
)
from clients.session_client import SessionClient
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from tests.support.asgi_federation import run_in_process

RESULTS = Path(__file__).resolve().parent / "results" / "stragglers.json"
LATE = 2  # the client that stalls


def stalling_client(*, every: int, stall: float) -> type[SessionClient]:
    """A new class each call: it remembers the passes it took part in."""

    class Stalling(SessionClient):
        """Sleeps before its first share of every ``every``-th pass it takes part in."""

        attempted: ClassVar[set[int]] = set()

        def put_share(self, pass_index: int, *args: Any, **kwargs: Any) -> None:
            if pass_index not in self.attempted:
                self.attempted.add(pass_index)
                if len(self.attempted) % every == 0:
                    time.sleep(stall)
            super().put_share(pass_index, *args, **kwargs)

    return Stalling


def late_as(m: int, late: type[SessionClient]) -> type[SessionClient]:
    return late if m == LATE else SessionClient


def one_seed(dataset: GraphDataset, base: TrainConfig, args: argparse.Namespace) -> dict:
    stalling = {"every": args.every, "stall": args.stall}
    variants = {
        "no stall": (dataclasses.replace(base, stragglers="continue"), SessionClient),
        "wait": (base, stalling_client(**stalling)),
        "continue": (dataclasses.replace(base, stragglers="continue"), stalling_client(**stalling)),
    }
    out = {}
    for name, (config, late) in variants.items():
        with tempfile.TemporaryDirectory() as work:
            run = run_in_process(
                config, dataset, Path(work), service_class=partial(late_as, late=late)
            )
        results, wall = run.results, run.wall_seconds
        final = results[0].history[-1]
        out[name] = {
            "passes": results[0].passes,
            "test_accuracy": final["test_accuracy"],
            # its last evaluation: it may have missed the final one
            "late_client_test_accuracy": (
                results[LATE].history[-1]["test_accuracy"] if results[LATE].history else None
            ),
            "missed_passes": len(results[LATE].skipped),
            "wall_s": round(wall, 1),
        }
        print(f"  seed {base.seed} {name:>9}: {out[name]}", flush=True)
    return out


def markdown(out: dict) -> str:
    s = out["settings"]
    lines = [
        "## Straggler policies (`bench/stragglers.py`)",
        "",
        f"Three workers and the service app in one process (ASGI transport), Cora, {s['rounds']} "
        f"rounds (K = {s['agg_layers']}, Q = {s['stale']}, evaluation every {s['eval_every']}), "
        f"plaintext sums, no DP. Client {LATE} stalls {s['stall']} s before its first share "
        f"in every {s['every']}th pass it takes part in (the others do about 20 passes in "
        "that time); 'continue' closes a "
        f"layer {s['wait']} s after its first share. Test accuracy of client 0 and of the late "
        "client (%, at the last evaluation it took part in), passes the late client missed, wall "
        "time relative to no stall; mean ± std "
        f"over seeds {s['seeds']}.",
        "",
        "| policy | accuracy, client 0 | accuracy, late client | passes missed | wall time |",
        "|---|---|---|---|---|",
    ]
    runs = out["runs"]
    for name in ("no stall", "wait", "continue"):
        acc = [r[name]["test_accuracy"] for r in runs]
        late = [r[name]["late_client_test_accuracy"] for r in runs]
        late = [v for v in late if v is not None]
        missed = [r[name]["missed_passes"] for r in runs]
        ratio = [r[name]["wall_s"] / r["no stall"]["wall_s"] for r in runs]
        lines.append(
            f"| {name} | {100 * np.mean(acc):.1f} ± {100 * np.std(acc):.1f} | "
            + (f"{100 * np.mean(late):.1f} ± {100 * np.std(late):.1f}" if late else "-")
            + f" ({len(late)} of {len(runs)} seeds) | "
            f"{np.mean(missed):.1f} of {s['passes_total']} | {np.mean(ratio):.2f}x |"
        )
    lines += [
        "",
        "Reproduce: `python -m bench.stragglers --seeds 0 1` (results in "
        "`bench/results/stragglers.json`; `--docs-only` rewrites this section).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--every", type=int, default=25, help="stall every k passes it is in")
    parser.add_argument("--stall", type=float, default=6.0, help="seconds of each stall")
    parser.add_argument("--wait", type=float, default=2.0, help="straggler_wait_seconds")
    add_results_arguments(parser, RESULTS)
    args = parser.parse_args()
    if rewrote_docs_only(args, "stragglers", markdown):
        return
    single_thread()
    base = TrainConfig(
        rounds=args.rounds, eval_every=20, hidden=64, encryption="none", dp=False,
        straggler_wait_seconds=args.wait,
    )  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        dataset = load_copied("cora", scratch=Path(scratch), split="paper")
        for seed in args.seeds:
            runs.append(one_seed(dataset, dataclasses.replace(base, seed=seed), args))
    passes_total = runs[0]["no stall"]["passes"]
    out = {
        "settings": {
            "rounds": args.rounds, "agg_layers": base.agg_layers, "stale": base.stale,
            "eval_every": base.eval_every, "every": args.every, "stall": args.stall,
            "wait": args.wait, "seeds": args.seeds, "passes_total": passes_total,
        },
        "runs": runs,
    }  # fmt: skip
    write_json(args.out, out)
    write_section("stragglers", markdown(out))
    print(markdown(out))


if __name__ == "__main__":
    main()
