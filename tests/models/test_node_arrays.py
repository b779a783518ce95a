"""The N-row arrays of an evaluation pass live in unlinked temporary files on the CPU
(``models.node_arrays``), so a pass's anonymous memory is bounded by its chunk, not by N."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch

import models.node_arrays
from models.config import TrainConfig
from models.inprocess import run_pass_inprocess
from models.layout import eval_nodes
from models.node_arrays import chunk_rows, host_rows, node_array
from models.private import REPRODUCIBLE_NOISE_ENV
from tests.models.test_layerwise import federation

CPU = torch.device("cpu")


def pass_mappings() -> list[str]:
    """This process's shared mappings of unlinked files in the temporary folder."""
    folder = tempfile.gettempdir()
    with open("/proc/self/maps") as maps:
        return [
            line for line in maps
            if " rw-s " in line and f" {folder}/" in line and line.rstrip().endswith("(deleted)")
        ]  # fmt: skip


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_a_large_array_is_an_unlinked_file_mapping_released_with_its_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(models.node_arrays, "SPILL_BYTES", 1 << 16)
    before = len(pass_mappings())
    small = node_array(100, 8, device=CPU)
    assert len(pass_mappings()) == before  # 3,200 bytes stay in memory
    large = node_array(5000, 8, device=CPU)
    mapped = pass_mappings()[before:]
    assert len(mapped) == 1  # unlinked: nothing is left on disk
    large[:] = torch.arange(40000, dtype=torch.float32).reshape(5000, 8)
    view = large.numpy()[4999]
    assert view.tolist() == list(range(39992, 40000))
    assert small.shape == (100, 8)
    del large, view
    gc.collect()
    assert len(pass_mappings()) == before


def test_host_rows_of_a_cpu_tensor_is_a_view() -> None:
    tensor = torch.rand(10, 3)
    rows = host_rows(tensor, chunk=4)
    rows[0, 0] = 7.0
    assert tensor[0, 0] == 7.0
    assert [(s.start, s.stop) for s in chunk_rows(10, chunk=4)] == [(0, 4), (4, 8), (8, 10)]


PASS_UNDER_A_DATA_LIMIT = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    import models.layerwise, models.node_arrays
    from models.config import TrainConfig
    from models.data.csbm import csbm
    from models.inprocess import run_pass_inprocess
    from models.layout import eval_nodes, layout_federation
    from models.private import make_client
    from models.trainer import prepare_security

    spill, private, headroom = sys.argv[1] == "spill", sys.argv[2] == "private", int(sys.argv[3])
    models.node_arrays.SPILL_BYTES = 1 << 20 if spill else 1 << 62
    models.layerwise.EVAL_CHUNK_NODES = 512
    torch.set_num_threads(1)
    data = csbm(nodes=30000, degree=8, features=32, seed=0)
    config = TrainConfig(
        dataset="csbm", mode="glasu", clients=2, layers=3, agg_layers=1 if private else 2,
        hidden=512, encryption="none", dp=private, noise_multiplier=1.0, epsilon=None,
        release_width=64, rounds=1, batch_size=32, seed=1,
    )
    layout = layout_federation(config, data)
    security = prepare_security(config, passes_total=2, clients=2)
    clients = [
        make_client(part, layout.client_config, codec=security.codec_factory(), device="cpu",
                    privacy=security.privacy, seed=1)
        for part in layout.partitions
    ]
    data_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmData"))
    # from here on, private writable memory (what malloc and torch's allocator take) may grow by
    # `headroom` MB; the arrays' shared file mappings do not count against RLIMIT_DATA
    limit = (data_kb << 10) + (headroom << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.RLIM_INFINITY))
    try:
        outcomes = run_pass_inprocess(
            clients, security.aggregator, pass_index=0, kind="eval", output_nodes=eval_nodes(data)
        )
    except (MemoryError, RuntimeError) as error:
        print(json.dumps({"fits": False, "error": str(error)[:300]}))
    else:
        print(json.dumps({"fits": True, "accuracy": outcomes[0].test_accuracy}))
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_DATA as Linux (4.7+) counts it")
@pytest.mark.parametrize("arrangement", ["plain", "private"])
def test_an_evaluation_pass_fits_a_memory_limit_its_arrays_exceed(arrangement: str) -> None:
    """30,000 nodes at width 512: each N-row array is 61 MB, a plain pass holds 4 of them and a
    private one (network and party-alone reference) 7. Under a limit of 200 MB on the private
    memory the pass may add, it runs with its arrays in files, and fails without (so the limit
    bites); chunks of 512 targets need well under it."""

    def run(spill: str) -> dict:
        child = subprocess.run(
            [sys.executable, "-c", PASS_UNDER_A_DATA_LIMIT, spill, arrangement, "200"],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        return json.loads(child.stdout.strip().splitlines()[-1])

    spilled = run("spill")
    assert spilled["fits"], spilled
    assert 0.0 <= spilled["accuracy"] <= 1.0
    in_memory = run("memory")
    assert not in_memory["fits"], in_memory
    assert "allocate" in in_memory["error"]


@pytest.mark.parametrize("private", [False, True])
def test_a_pass_over_file_backed_arrays_equals_one_in_memory(
    cora, private: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every array of a count-aware evaluation pass (plain: the chunked combine; private: the
    release, the reference's stack, the chunked receiver) in files gives the outcome of the
    pass in memory."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    config = TrainConfig(
        dataset="cora", mode="glasu", clients=3, hidden=16, encryption="none", dp=private,
        noise_multiplier=1.0, epsilon=None, rounds=2, batch_size=32, seed=1, noise_seed=5,
        release_width=64, nodes="union",
    )  # fmt: skip

    def evaluate() -> list:
        clients, aggregator = federation(config, cora)
        return run_pass_inprocess(
            clients, aggregator, pass_index=0, kind="eval", output_nodes=eval_nodes(cora)
        )

    in_memory = evaluate()
    monkeypatch.setattr(models.node_arrays, "SPILL_BYTES", 0)
    opened: list[int] = []
    temporary_file = models.node_arrays.tempfile.TemporaryFile

    def counting(*args, **kwargs):
        opened.append(1)
        return temporary_file(*args, **kwargs)

    monkeypatch.setattr(models.node_arrays.tempfile, "TemporaryFile", counting)
    in_files = evaluate()
    assert len(opened) >= 3 * 5  # every client's h0, its layers, the others' part...
    for one, other in zip(in_memory, in_files, strict=True):
        assert one.test_accuracy == other.test_accuracy
        assert one.reference_test_accuracy == other.reference_test_accuracy
        if one.probabilities is not None:
            np.testing.assert_array_equal(one.probabilities, other.probabilities)
