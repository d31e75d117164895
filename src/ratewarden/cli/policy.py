"""``ratewarden check POLICY`` and ``ratewarden explain POLICY --path /x --method GET --header "K: v"``."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import urlsplit

from ..enforcement.core import key_value
from ..errors import AmbiguousRequest
from ..limiter import Limiter
from ..policy.loader import load_policy
from ..policy.schema import Policy, PolicyError, describe_rule, limits_nothing
from ..policy.tiers import PolicyRule
from ..rates import parse_rates
from ..rules import Rule
from ..stores.memory import MemoryStore

__all__ = ["explain", "register", "register_check", "register_explain", "split_target"]


def register(subparsers: Any) -> None:
    """Add both commands."""
    register_check(subparsers)
    register_explain(subparsers)


def register_check(subparsers: Any) -> None:
    parser = subparsers.add_parser("check", help="validate a policy file and print its effective rules")
    parser.add_argument("policy", help="policy file (.toml, .yaml or .yml)")
    parser.add_argument("--allow-empty", action="store_true",
                        help="accept a policy without rules (by default it fails: it limits nothing)")
    parser.set_defaults(func=_check)


def register_explain(subparsers: Any) -> None:
    parser = subparsers.add_parser("explain", help="show which rules and limits a request would get")
    parser.add_argument("policy", help="policy file (.toml, .yaml or .yml)")
    parser.add_argument("--path", required=True,
                        help="request path, e.g. /api/items (a query string after '?' is split off, as a server does)")
    parser.add_argument("--method", default="GET", help="HTTP method (default GET)")
    parser.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'", help="request header (repeatable)")
    parser.add_argument("--query", default="", help="query string, e.g. api_key=k")
    parser.add_argument("--client", default="127.0.0.1", help="client address (default 127.0.0.1)")
    parser.set_defaults(func=_explain)


def _load(path: str) -> Policy | int:
    """The policy, or the exit status after printing why not: 1 for an invalid file (one line
    when it has one problem), 2 when it cannot be read at all (a missing extra). A policy that
    limits nothing is loaded: ``check`` decides about it."""
    try:
        return load_policy(path, allow_empty=True)
    except PolicyError as exc:
        if len(exc.problems) == 1:
            print(f"invalid policy: {exc.problems[0]}", file=sys.stderr)
            return 1
        print(f"{path}: invalid policy ({len(exc.problems)} problem(s)):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    except ImportError as exc:  # YAML without PyYAML, TOML on Python 3.10 without tomli
        print(f"ratewarden: {path}: {exc}", file=sys.stderr)
        return 2


def _check(args: argparse.Namespace) -> int:
    policy = _load(args.policy)
    if isinstance(policy, int):
        return policy
    print("\n".join(policy.describe()))
    if limits_nothing(policy):
        what = "has only bypass rules" if policy.rules else "has no rules"
        if not args.allow_empty and not policy.allow_empty:
            print(f"ratewarden check: {args.policy}: the policy {what}, so it limits nothing "
                  "(pass --allow-empty or set allow_empty = true under [settings] if that is intended)", file=sys.stderr)
            return 1
        print(f"ratewarden check: {args.policy}: warning: the policy {what}, so it limits nothing", file=sys.stderr)
    print("OK")
    return 0


def split_target(target: str) -> tuple[str, str]:
    """``(path, query)`` of a request target such as ``/login?next=/`` or a full URL (a
    ``#fragment`` is dropped: clients never send it); rules match the path alone."""
    if "://" in target.partition("?")[0]:
        parts = urlsplit(target)
        return parts.path or "/", parts.query
    path = target.partition("#")[0]
    path, _, query = path.partition("?")
    return path, query


def explain(policy: Policy, method: str, path: str, headers: list[tuple[str, str]], query: str = "", client: str = "127.0.0.1") -> list[str]:
    """Lines saying which rules and limits apply to the described request."""
    from ..rules import RuleSet

    scope: dict[str, Any] = {
        "type": "http",
        "method": method.upper(),
        "path": path,
        "query_string": query.encode("latin-1"),
        "headers": [(k.strip().lower().encode("latin-1"), v.strip().encode("latin-1")) for k, v in headers],
        "client": (client, 0),
        "state": {},
    }
    ruleset = RuleSet(policy.rules, Limiter(MemoryStore()).prefix)
    bypass = next((r for r in policy.rules if r.bypass and r.applies(scope["method"], path)), None)
    if bypass is not None:
        return [f"{scope['method']} {path}: bypassed by rule {bypass.name!r} (no limits)"]
    matched = ruleset.match(scope["method"], path)
    others = _other_methods(policy, scope["method"], path)
    if not matched:
        return [f"{scope['method']} {path}: no rule matches (not limited)", *others]
    out = [f"{scope['method']} {path}: {len(matched)} rule(s)" + (" (shadow mode: never blocks)" if policy.shadow else "")]
    for compiled in matched:
        rule = compiled.rule
        out.append("  " + describe_rule(rule))
        try:
            out.append(_charged(rule, scope))
        except AmbiguousRequest as exc:
            out.append(f"    refused with 400: {exc}")
    return [*out, *others]


def _charged(rule: Rule, scope: dict[str, Any]) -> str:
    """Who ``rule`` charges for the request (with its group, when the rule is tiered)."""
    if isinstance(rule, PolicyRule) and rule.tiers is not None:
        identity = rule.tiers.identity
        api_key = identity.api_key(scope)
        group, key = identity.resolve(scope)
        rates = rule.tiers.groups[group]
        how = "no API key" if api_key is None else "API key"
        limits = "unlimited" if rates is None else "; ".join(str(r) for r in parse_rates(rates))
        return f"    group {group} ({how}), charged as {key}: {limits}"
    return f"    charged as {key_value(rule.key, scope)}"


def _other_methods(policy: Policy, method: str, path: str) -> list[str]:
    """A line for each rule whose path matches but whose methods leave ``method`` out, naming the
    ``--method`` that would match it."""
    lines = []
    for rule in policy.rules:
        methods = rule.methods
        if rule.bypass or methods is None or method in methods or rule.pattern.fullmatch(path) is None:
            continue
        names = sorted(methods)
        lines.append(
            f"  rule {rule.name!r} matches this path for {', '.join(names)} only (try --method {names[0]})"
        )
    return lines


def _explain(args: argparse.Namespace) -> int:
    policy = _load(args.policy)
    if isinstance(policy, int):
        return policy
    headers = []
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            print(f"--header {item!r}: expected 'Name: value'", file=sys.stderr)
            return 2
        headers.append((name, value))
    path, query = split_target(args.path)
    if not path.startswith("/"):
        print(f"--path {args.path!r}: expected a path starting with '/', e.g. /api/items", file=sys.stderr)
        return 2
    lines: list[str] = []
    if path != args.path:
        parts = []
        if "://" in args.path.partition("?")[0]:
            parts.append("the scheme and host are dropped")
        if query:
            parts.append(f"the query string {query!r} is read as --query")
        elif "?" in args.path.partition("#")[0]:
            parts.append("the empty query string is dropped")
        if "#" in args.path:
            parts.append("the #fragment is dropped (clients never send it)")
        lines.append(f"note: --path {args.path!r}: rules match the path {path!r} alone; {'; '.join(parts)}")
    if query and args.query:
        query = f"{query}&{args.query}"
    elif args.query:
        query = args.query
    lines += explain(policy, args.method, path, headers, query, args.client)
    print("\n".join(lines))
    return 0


