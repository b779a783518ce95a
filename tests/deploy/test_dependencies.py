"""pyproject's dependencies against the code: every package the project imports is declared, and
the `service` dependency group (what the torch-free service image installs) is the project's
dependencies minus the torch side, with everything the service's own code imports."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata

from deploykit import REPO

PACKAGES = ("service", "secure", "clients", "models")
SERVICE_SIDE = ("service", "secure")  # what `glasu serve` runs (clients/cli only lazily)
# Needed by the workers and the local federation, never by the service.
TORCH_SIDE = {"torch", "torch-geometric", "tqdm", "matplotlib", "pyarrow", "pynacl", "scikit-learn"}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]).lower()


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _imports(*packages: str) -> dict[str, set[str]]:
    """Top-level modules imported anywhere in the packages (also inside functions) -> files."""
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def _third_party(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """module -> distributions providing it, for modules not of the stdlib or the project."""
    providers = metadata.packages_distributions()
    return {
        module: {_name(d) for d in providers.get(module, [module])}
        for module in modules
        if module not in sys.stdlib_module_names and module not in PACKAGES
    }


def test_the_service_group_is_the_dependencies_without_the_torch_side() -> None:
    project = _pyproject()
    dependencies = {_name(r): r for r in project["project"]["dependencies"]}
    group = {_name(r): r for r in project["dependency-groups"]["service"]}
    assert set(dependencies) >= TORCH_SIDE, "a torch-side package left the dependencies"
    assert set(group) == set(dependencies) - TORCH_SIDE, (
        "a dependency was added to or removed from [project].dependencies: add it to the "
        "`service` group too (or to TORCH_SIDE here if the service never imports it)"
    )
    for name, requirement in group.items():
        assert requirement == dependencies[name], f"{name}: {requirement} != {dependencies[name]}"


def _with_their_requirements(names: set[str]) -> set[str]:
    """The distributions and what they require (one level: starlette comes with fastapi)."""
    found = set(names)
    for name in names:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        found |= {_name(r) for r in requires if "extra ==" not in r}
    return found


def test_every_imported_package_is_declared() -> None:
    declared = _with_their_requirements({_name(r) for r in _pyproject()["project"]["dependencies"]})
    missing = {
        module: sorted(files)[:3]
        for module, dists in _third_party(_imports(*PACKAGES)).items()
        if not dists & declared
        for files in [_imports(*PACKAGES)[module]]
    }
    assert not missing, f"imported but not in [project].dependencies: {missing}"


def test_the_service_code_imports_only_the_service_group() -> None:
    group = _with_their_requirements(
        {_name(r) for r in _pyproject()["dependency-groups"]["service"]}
    )
    imported = _imports(*SERVICE_SIDE)
    outside = {
        module: sorted(imported[module])[:3]
        for module, dists in _third_party(imported).items()
        if not dists & group
    }
    assert not outside, f"service/ or secure/ imports what the service image lacks: {outside}"
