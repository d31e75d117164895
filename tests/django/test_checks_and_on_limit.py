"""``manage.py check`` reports a bad ``RATEWARDEN`` setting (a missing ``POLICY`` file among them)
before the first request, and ``ON_LIMIT`` answers instead of the 429 on the middleware and ``@limit``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.http import HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings

from ratewarden.decision import Decision
from ratewarden.django import SettingsError, load_config
from tests.django.settings import ratewarden_settings

ROOT = Path(__file__).resolve().parents[2]


def too_many(request: Any, decision: Decision) -> Any:
    """A django-ratelimit style RATELIMIT_VIEW: a page of the site's own."""
    return JsonResponse({"path": request.path, "retry": decision.retry_after > 0}, status=429)


def only_for_api(request: Any, decision: Decision) -> Any:
    return HttpResponse("slow down", status=429) if request.path.startswith("/mw/") else None


async def async_too_many(request: Any, decision: Decision) -> Any:
    return HttpResponse("async slow down", status=429, headers={"Retry-After": "7"})


def ratewarden_errors() -> list[Any]:
    return [e for e in checks.run_checks(tags=["ratewarden"]) if e.id and e.id.startswith("ratewarden.")]


# -- the system check ----------------------------------------------------------------------------


def test_the_check_passes_on_good_settings() -> None:
    assert ratewarden_errors() == []


@pytest.mark.parametrize(("options", "named"), [
    ({"POLICY": "/no/such/policy.toml"}, "RATEWARDEN['POLICY']"),
    ({"STORE": "nosuch://x"}, "RATEWARDEN['STORE']"),
    ({"STORE": "redis://:6379/zero"}, "RATEWARDEN['STORE']"),
    ({"HEADERS": "sometimes"}, "RATEWARDEN['HEADERS']"),
    ({"ON_LIMIT": "tests.django.nosuch.view"}, "RATEWARDEN['ON_LIMIT']"),
    ({"RULE": []}, "unknown option(s) 'RULE'"),
])
def test_the_check_names_a_bad_option(options: dict[str, Any], named: str) -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(**options)):
        errors = ratewarden_errors()
    assert [e.id for e in errors] == ["ratewarden.E001"]
    assert named in errors[0].msg


def test_the_check_names_the_middleware_without_rules() -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(RULES=[])):
        errors = ratewarden_errors()
    assert [e.id for e in errors] == ["ratewarden.E002"] and "RateLimitMiddleware" in errors[0].msg


def test_the_check_opens_no_store(tmp_path: Path) -> None:
    directory = tmp_path / "segments"
    directory.mkdir()
    with override_settings(RATEWARDEN=ratewarden_settings(STORE=f"shm://checked?directory={directory}")):
        assert ratewarden_errors() == []
    assert list(directory.iterdir()) == []


def manage_check(tmp_path: Path, ratewarden: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "checked_settings.py").write_text(
        "SECRET_KEY = 'x'\nINSTALLED_APPS = ['ratewarden.django']\nDATABASES = {}\n"
        "MIDDLEWARE = ['ratewarden.django.RateLimitMiddleware']\n"
        f"RATEWARDEN = {ratewarden}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "DJANGO_SETTINGS_MODULE": "checked_settings"}
    return subprocess.run([sys.executable, "-m", "django", "check"], capture_output=True, text=True, env=env, timeout=120)


def test_manage_py_check_fails_on_a_missing_policy_file(tmp_path: Path) -> None:
    missing = tmp_path / "limits.toml"
    result = manage_check(tmp_path, repr({"POLICY": str(missing)}))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ratewarden.E001" in result.stderr and "RATEWARDEN['POLICY']" in result.stderr and str(missing) in result.stderr
    assert "Traceback" not in result.stderr

    missing.write_text('version = 1\n[[rules]]\npath = "/api/**"\nrate = "10/min"\n')
    result = manage_check(tmp_path, repr({"POLICY": str(missing)}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


# -- ON_LIMIT ------------------------------------------------------------------------------------


@pytest.mark.parametrize("on_limit", [too_many, "tests.django.test_checks_and_on_limit.too_many"], ids=["callable", "dotted"])
def test_on_limit_answers_for_the_middleware(on_limit: Any) -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(ON_LIMIT=on_limit)):
        client = Client()
        responses = [client.get("/mw/hello") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    denied = responses[-1]
    assert json.loads(denied.content) == {"path": "/mw/hello", "retry": True}
    assert denied["Content-Type"] == "application/json"
    assert int(denied["Retry-After"]) >= 1 and denied["X-RateLimit-Remaining"] == "0"  # added: it set neither


def test_on_limit_answering_none_keeps_the_429() -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(ON_LIMIT=only_for_api, RULES=[{"path": "/**", "rate": "1/min"}])):
        client = Client()
        assert [client.get("/mw/hello").status_code for _ in range(2)] == [200, 429]
        assert client.get("/mw/hello").content == b"slow down"
        assert client.get("/free")["Content-Type"] == "application/problem+json"


def test_on_limit_answers_for_the_decorator_but_not_without_block() -> None:
    calls: list[str] = []

    def counted(request: Any, decision: Decision) -> Any:
        calls.append(request.path)
        return HttpResponse("decorated", status=429)

    with override_settings(RATEWARDEN=ratewarden_settings(ON_LIMIT=counted)):
        client = Client()
        fbv = [client.get("/fbv") for _ in range(4)]
        assert fbv[-1].status_code == 429 and fbv[-1].content == b"decorated" and "Retry-After" in fbv[-1]
        soft = [client.get("/soft") for _ in range(4)]
    assert soft[-1].status_code == 200  # block=False: the view decides, ON_LIMIT is not asked
    assert calls == ["/fbv"] * sum(r.status_code == 429 for r in fbv)


async def test_an_async_on_limit_answers_under_asgi() -> None:
    with override_settings(RATEWARDEN=ratewarden_settings(ON_LIMIT=async_too_many)):
        client = AsyncClient()
        responses = [await client.get("/mw/async") for _ in range(6)]
    denied = responses[-1]
    assert denied.status_code == 429 and denied.content == b"async slow down"
    assert denied["Retry-After"] == "7"  # its own, kept


def test_on_limit_must_be_callable() -> None:
    with pytest.raises(SettingsError, match=r"RATEWARDEN\['ON_LIMIT'\]: must be a function of \(request, decision\)"):
        load_config({"ON_LIMIT": 429})


def test_an_async_on_limit_in_a_sync_request_is_refused_by_name() -> None:
    """The blocking driver cannot await ``ON_LIMIT``'s coroutine: closed, and a ``TypeError`` naming
    the setting and where ``async def`` works, not a response built from an awaitable."""
    with override_settings(RATEWARDEN=ratewarden_settings(ON_LIMIT=async_too_many)):
        client = Client(raise_request_exception=True)
        assert [client.get("/mw/hello").status_code for _ in range(5)] == [200] * 5
        with pytest.raises(TypeError, match=r"RATEWARDEN\['ON_LIMIT'\] \(async def works under ASGI only\) returned an awaitable"):
            client.get("/mw/hello")
