"""Start-up refusals, the server entry point, health and Prometheus metrics."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from service_testkit import (
    ADMIN_TOKEN,
    Federation,
    ServedProcess,
    admin,
    create_session,
    private_session_request,
    session_request,
    start_serve,
)

from service import server
from service.settings import ServiceSettings


def test_refuses_to_start_without_an_admin_token(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="GLASU_ADMIN_TOKEN"):
        ServiceSettings(database=tmp_path / "db.sqlite3")


def test_refuses_a_short_token_or_two_sources(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="shorter than 16"):
        ServiceSettings(admin_token="secret")
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN_TOKEN)
    with pytest.raises(ValidationError, match="only one"):
        ServiceSettings(admin_token=ADMIN_TOKEN, admin_token_file=token_file)
    with pytest.raises(ValidationError, match="admin_token_file"):
        ServiceSettings(admin_token_file=tmp_path / "missing")


def test_admin_token_from_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    assert ServiceSettings(admin_token_file=token_file).admin_token_value == ADMIN_TOKEN
    monkeypatch.setenv("GLASU_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("GLASU_LONG_POLL_SECONDS", "5")
    monkeypatch.setenv("GLASU_MAX_BODY_BYTES", "2048")
    settings = ServiceSettings()
    assert settings.admin_token_value == ADMIN_TOKEN
    assert (settings.long_poll_seconds, settings.max_body_bytes, settings.port) == (5, 2048, 8000)
    assert ADMIN_TOKEN not in repr(settings)


def test_settings_bounds_and_typos(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="long_poll_seconds"):
        ServiceSettings(admin_token=ADMIN_TOKEN, long_poll_seconds=61)
    with pytest.raises(ValidationError, match="extra"):
        ServiceSettings(admin_token=ADMIN_TOKEN, admin_tokn="x")
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ValidationError, match="together"):
        ServiceSettings(admin_token=ADMIN_TOKEN, tls_certfile=cert)


def test_serve_passes_tls_and_address_to_uvicorn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("cert")
    key.write_text("key")
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(server.uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    settings = ServiceSettings(
        database=tmp_path / "db.sqlite3",
        admin_token=ADMIN_TOKEN,
        host="0.0.0.0",
        port=8443,
        tls_certfile=cert,
        tls_keyfile=key,
        log_level="warning",
    )
    server.serve(settings)
    (kwargs,) = calls
    assert kwargs["host"] == "0.0.0.0" and kwargs["port"] == 8443
    assert kwargs["ssl_certfile"] == str(cert) and kwargs["ssl_keyfile"] == str(key)
    assert kwargs["log_level"] == "warning"


@pytest.mark.anyio
async def test_health_and_metrics_need_no_token(client: httpx.AsyncClient) -> None:
    health = await client.get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "encryption": False, "max_body_bytes": 64 * 2**20}

    request = session_request(rounds=1, eval_every=0)
    created = await create_session(client, rounds=1, eval_every=0)
    federation = Federation(client, created, request)
    await federation.run_pass(0)

    metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'glasu_passes_completed_total{kind="train"} 1.0' in text
    assert "glasu_active_sessions 1.0" in text
    assert 'glasu_bytes_received_total{kind="embedding"}' in text
    assert 'glasu_bytes_sent_total{kind="aggregate"}' in text
    assert (  # 3 clients x 2 aggregation layers
        'glasu_request_duration_seconds_count{method="PUT",'
        'route="/v1/sessions/{sid}/clients/{m}/passes/{p}/layers/{l}/embedding",status="201"} 6.0'
    ) in text


@pytest.mark.anyio
async def test_openapi_documents_the_binary_routes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    put = spec["paths"]["/v1/sessions/{sid}/clients/{m}/passes/{p}/layers/{l}/embedding"]["put"]
    assert "application/octet-stream" in put["requestBody"]["content"]
    assert {"X-Glasu-Shape", "X-Glasu-Encoding"} <= {p["name"] for p in put["parameters"]}
    get = spec["paths"]["/v1/sessions/{sid}/clients/{m}/passes/{p}/layers/{l}/aggregate"]["get"]
    assert "X-Glasu-Count" in get["responses"]["200"]["headers"]
    assert "202" in get["responses"]
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    assert (await client.get("/docs")).status_code == 200


def test_an_explicit_admin_token_source_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`glasu train` passes --admin-token-file while the shell may export GLASU_ADMIN_TOKEN."""
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file-0123456789")
    monkeypatch.setenv("GLASU_ADMIN_TOKEN", ADMIN_TOKEN)
    assert (
        ServiceSettings(admin_token_file=token_file).admin_token_value == "from-the-file-0123456789"
    )
    monkeypatch.delenv("GLASU_ADMIN_TOKEN")
    monkeypatch.setenv("GLASU_ADMIN_TOKEN_FILE", str(token_file))
    assert ServiceSettings(admin_token="explicit-token-0123456789").admin_token_value == (
        "explicit-token-0123456789"
    )
    monkeypatch.setenv("GLASU_ADMIN_TOKEN", ADMIN_TOKEN)
    with pytest.raises(ValidationError, match="only one"):
        ServiceSettings()  # both from the environment: ambiguous


def test_the_service_does_not_import_models_clients_or_torch() -> None:
    """Only secure.accounting (through Opacus) loads torch, on the first privacy session."""
    code = (
        "import sys, service.app, service.server\n"
        "heavy = ('torch', 'models', 'clients', 'tenseal', 'opacus')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


TORCH_MARKERS = ("libtorch", "/torch/", "/torch_geometric/")
# Measured: ~82 MB up, ~152 MB after the first DP session (the accountants: dp-accounting,
# prv-accountant, scipy). Importing torch alone adds about 300 MB.
MAX_IDLE_RSS_MB = 190


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _torch_files_mapped(pid: int) -> list[str]:
    paths = {
        line.split(maxsplit=5)[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
    }
    return sorted(p for p in paths if any(marker in p for marker in TORCH_MARKERS))


@pytest.fixture
def glasu_serve(tmp_path: Path) -> Iterator[ServedProcess]:
    """`glasu serve` as deploy/Dockerfile.service runs it (entrypoint `glasu`, command `serve`),
    on a temporary database and admin token file."""
    served = start_serve(tmp_path, tmp_path / "service.sqlite3")
    try:
        yield served
    finally:
        served.stop()


def test_the_served_process_never_maps_torch(glasu_serve: ServedProcess) -> None:
    """The process `glasu serve` runs, up and after its first session with differential privacy
    (which loads the privacy accountant), has no torch library mapped and stays small."""
    process, base = glasu_serve.process, glasu_serve.url
    glasu_serve.wait_healthy()  # it has served a request: started up
    rss_started = _rss_mb(process.pid)
    request = private_session_request(
        {"delta": 1e-5, "clip": 1.0, "occurrence_cap": 0, "noise_multiplier": 2.0}
    )
    response = httpx.post(f"{base}/v1/sessions", json=request, headers=admin(), timeout=60)
    assert response.status_code == 201, response.text  # the accountant is loaded
    rss_idle = _rss_mb(process.pid)
    sizes = f"RSS {rss_started:.1f} MB after start-up, {rss_idle:.1f} MB after a DP session"
    print(sizes)
    assert _torch_files_mapped(process.pid) == [], sizes
    assert rss_idle < MAX_IDLE_RSS_MB, sizes
