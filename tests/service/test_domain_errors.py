"""The split between domain errors and problem details (service/domain_errors.py, errors.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from service import domain_errors
from service.domain_errors import DomainError
from service.errors import DOMAIN_PROBLEMS, TITLES, domain_problem

SERVICE = Path(__file__).resolve().parents[2] / "service"
# Only the HTTP layer may raise ProblemError (see service/domain_errors.py).
HTTP_LAYER = {"app.py", "errors.py", "limits.py", "http_protocol.py", "api"}


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_domain_error_has_a_status_and_a_titled_slug() -> None:
    classes = [c for c in _subclasses(DomainError) if c.__module__ == domain_errors.__name__]
    assert set(DOMAIN_PROBLEMS) == set(classes)
    for cls in classes:
        status, slug = DOMAIN_PROBLEMS[cls]
        assert 400 <= status < 600
        assert slug in TITLES, slug


def test_the_status_follows_the_class_not_the_slug() -> None:
    unknown = domain_errors.UnknownPass.not_in_schedule(7, 5)
    wrong = domain_errors.WrongPass("not-current", 7, 5)
    assert domain_problem(unknown) == (404, "wrong-pass")
    assert domain_problem(wrong) == (409, "wrong-pass")
    assert (
        str(unknown) == unknown.detail == "pass 7 is not in this session's schedule (passes 0..4)"
    )


def test_an_unmapped_domain_error_is_a_bug() -> None:
    class Unmapped(DomainError):
        pass

    with pytest.raises(LookupError, match="Unmapped"):
        domain_problem(Unmapped("x"))


def test_only_the_http_layer_raises_problem_errors() -> None:
    offenders = []
    for path in sorted(SERVICE.rglob("*.py")):
        if path.relative_to(SERVICE).parts[0] in HTTP_LAYER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "service.errors":
                offenders.append(str(path.relative_to(SERVICE)))
    assert offenders == []
