"""A worker of a GCN or GCNII model does not pay for PyG at start-up (GATConv is imported by the
GAT layer only, when one is built)."""

from __future__ import annotations

import subprocess
import sys


def _loaded_after(code: str) -> str:
    script = f"import sys\n{code}\nprint('torch_geometric' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return result.stdout.strip()


def test_the_worker_and_the_backbones_load_no_pyg_until_a_gat_layer_is_built() -> None:
    assert _loaded_after("import clients.worker, models.backbone, models.layers") == "False"
    built = "from models.layers import GATLayer\nGATLayer(8, 8, heads=2)"
    assert _loaded_after(built) == "True"
