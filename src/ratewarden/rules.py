"""Rules: which requests a limit applies to, and the precompiled table that matches them (path
patterns and normalisation are in ``paths``, the trie of glob rules in ``rule_index``)."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Sequence

from ._mypyc import mypyc_attr
from .algorithms import AlgorithmName
from .caches import remember
from .callables import require_arguments
from .errors import ConfigurationError
from .headers import policy_value
from .keys import ClientIP, KeyFunc, client_ip
from .limits import DEFAULT_ALGORITHM, Limit, make_limits
from .paths import compile_path, normalize_path
from .rates import Rate, freeze_rates
from .rule_index import Placement, RuleIndex, placement
from .storage_keys import MAX_KEY_LENGTH, safe_key, storage_key
from .types import Scope

# compile_path and normalize_path live in paths.py; re-exported as part of this module's API.
__all__ = ["CompiledRule", "Rule", "RuleSet", "compile_path", "normalize_path", "policy_of"]

CostFunc = Callable[[Scope], float]
_SCOPE_ARGUMENT = "one argument, the request's scope (a dict): def {}(scope): ..."
_MATCH_CACHE_LIMIT = 4096
_KEYS_CACHE_LIMIT = 4096
#: Longer paths are matched but never cached: a client choosing long paths cannot grow the match
#: cache (4,096 entries of at most this many characters).
MAX_CACHED_PATH = 1024


#: Method names a rule accepts: RFC 9110's, PATCH (RFC 5789), QUERY, and WebDAV's (RFC 4918, 3253).
HTTP_METHODS = frozenset({
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY",
    "PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK", "REPORT", "SEARCH",
})


def http_methods(methods: str | Iterable[str] | None, where: str = "Rule") -> frozenset[str] | None:
    """``methods`` as a set of upper-case method names (``None``: every method). A string is one
    method (``"POST"``, not the letters P, O, S, T); an unknown name is a ``ConfigurationError``,
    so a typo such as ``"GETT"`` cannot switch a limit off. ``GET`` brings ``HEAD`` with it: Flask,
    Django and Starlette answer ``HEAD`` with the ``GET`` view, so a limit on ``GET`` that left
    ``HEAD`` out would let the view run uncharged.

    Args:
        methods: One method name, several, or ``None``.
        where: What the methods belong to, for the error message.
    """
    if methods is None:
        return None
    # Typed as objects: the compiled build would reject a non-string with its own TypeError first.
    names: list[object] = [methods] if isinstance(methods, str) else list(methods)
    found: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise ConfigurationError(f"{where} methods must be HTTP method names such as 'POST', got {name!r}")
        upper = name.strip().upper()
        if upper not in HTTP_METHODS:
            raise ConfigurationError(
                f"{where} methods: unknown HTTP method {name!r}; use one or more of {', '.join(sorted(HTTP_METHODS))}"
            )
        found.add(upper)
    if not found:
        raise ConfigurationError(f"{where} methods is empty: leave it out (None) to apply to every method")
    if "GET" in found:
        found.add("HEAD")
    return frozenset(found)


@mypyc_attr(allow_interpreted_subclasses=True)
class Rule:
    """A limit on the requests whose path matches ``path`` (and ``methods``, if given).

    Args:
        path: Which paths: ``*`` is one segment, ``**`` any number (``/api/**`` also matches ``/api``); a
            ``re:`` prefix or a compiled pattern is a regex matched against the whole path. Requests
            are matched on their normalised path (``normalize_path``: ``//`` merged, ``.`` and ``..``
            resolved), the one the application routes to.
        rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
            every one must allow. ``None`` only with ``bypass`` or ``message_rate``.
        key: Who is charged: a key function of the scope (default: the client IP).
        algorithm: The algorithm's name (default ``"fixed_window"``).
        methods: The HTTP methods it applies to: one name (``"POST"``) or several, in any case; the
            default ``None`` means all. ``"GET"`` includes ``HEAD`` (frameworks answer ``HEAD``
            with the ``GET`` view). Requests' methods are compared case-insensitively. An unknown
            name is a ``ConfigurationError``.
        bypass: Matching requests skip every rule.
        name: Labels the limit in headers, storage keys and metrics; the default ``None`` means the path.
        label: What headers, 429 bodies, logs and metrics call the limit, when it is not ``name``
            (which still names the storage keys): ``""`` is the rate as written (``10/m``); the
            default ``None`` means ``name``.
        cost: What one request costs: a number, or a function of the scope.
        websocket: Limit WebSocket connections on this path (instead of HTTP requests).
        message_rate: Limits the messages of each client key on a WebSocket path, across all its
            connections (implies ``websocket``).
        shadow: Evaluate and report, but never block.
    """

    def __init__(
        self,
        path: str | re.Pattern[str] = "/**",
        rate: str | Rate | Iterable[str | Rate] | None = None,
        *,
        key: KeyFunc = client_ip,
        algorithm: AlgorithmName = DEFAULT_ALGORITHM,
        methods: str | Iterable[str] | None = None,
        bypass: bool = False,
        name: str | None = None,
        cost: float | CostFunc = 1,
        websocket: bool = False,
        message_rate: str | Rate | Iterable[str | Rate] | None = None,
        shadow: bool = False,
        label: str | None = None,
    ) -> None:
        if rate is None and message_rate is None and not bypass:
            raise ConfigurationError(f"Rule({path!r}) needs a rate (e.g. '100/min') unless bypass=True")
        # Read iterables (a generator) once: the rate is reused by every compiled copy of the rule.
        if rate is not None:
            rate = freeze_rates(rate, f"Rule({path!r}) rate")
        if message_rate is not None:
            message_rate = freeze_rates(message_rate, f"Rule({path!r}) message_rate")
        if not callable(key):
            raise TypeError(f"Rule({path!r}) key must be a key function of the scope (e.g. client_ip), got {key!r}")
        if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, (int, float))):
            raise TypeError(f"Rule({path!r}) cost must be a number or a function of the scope, got {cost!r}")
        # A key that cannot take the scope would raise on every request: refused here instead.
        require_arguments(key, 1, f"Rule({path!r}) key", _SCOPE_ARGUMENT.format("key"))
        if callable(cost):
            require_arguments(cost, 1, f"Rule({path!r}) cost", _SCOPE_ARGUMENT.format("cost"))
        self.path = path
        self.pattern = compile_path(path)
        self.rate = rate
        self.key = key
        self.algorithm = algorithm
        self.methods = http_methods(methods, f"Rule({path!r})")
        self.bypass = bypass
        self.name = name or (path if isinstance(path, str) else path.pattern)
        if not callable(cost) and not 0 <= cost < math.inf:
            raise ConfigurationError(f"Rule({path!r}) cost must be a finite number >= 0, got {cost!r}")
        self.cost = cost
        self.message_rate = message_rate
        self.websocket = websocket or message_rate is not None
        self.shadow = shadow
        # Validate eagerly so a bad rate string fails at start-up, not on the first request.
        shown = self.name if label is None else label
        self.limits: tuple[Limit, ...] = make_limits(rate, algorithm, shown) if rate is not None else ()
        self.message_limits: tuple[Limit, ...] = (
            make_limits(message_rate, algorithm, self.name + "-msg") if message_rate is not None else ()
        )

    def __repr__(self) -> str:
        methods = f", methods={sorted(self.methods)!r}" if self.methods is not None else ""
        return f"Rule({self.name!r}, {self.rate!r}, algorithm={self.algorithm!r}{methods})"

    def applies(self, method: str, path: str) -> bool:
        """Whether this rule's path and methods match the request.

        Args:
            method: The HTTP method.
            path: The request path.
        """
        return (self.methods is None or method in self.methods) and self.pattern.fullmatch(path) is not None


@mypyc_attr(allow_interpreted_subclasses=True)
class CompiledRule:
    """A rule bound to a limiter prefix: everything the hot path needs, precomputed.

    Two flags choose the hot path (``enforcement.check``): ``checked_inline`` (a sync key, a fixed cost,
    enforced, with limits) lets a request matching only this rule skip the lists of ``check_rules``
    and, on a local store, its coroutine (``check`` answers at once); ``one_limit`` (one storage key) lets
    it be checked with ``Store.hit_one``.

    Args:
        rule: The rule.
        prefix: The limiter's storage-key prefix.
    """

    __slots__ = (
        "checked_inline",
        "client_ip",
        "cost",
        "cost_fn",
        "costs",
        "key",
        "key_is_async",
        "keys_cache",
        "limits",
        "message_costs",
        "message_limits",
        "one_limit",
        "policy",
        "prefix",
        "rule",
        "shadow",
        "suffixes",
    )

    def __init__(self, rule: Rule, prefix: str) -> None:
        self.rule = rule
        self.key = rule.key
        # The default key (a ClientIP), called natively by the fast path.
        self.client_ip: ClientIP | None = rule.key if isinstance(rule.key, ClientIP) else None
        self.key_is_async = inspect.iscoroutinefunction(rule.key) or inspect.iscoroutinefunction(
            getattr(rule.key, "__call__", None)  # noqa: B004 - callable objects with async __call__
        )
        self.limits = rule.limits
        self.prefix = prefix
        self.suffixes = tuple(limit.suffix for limit in rule.limits)
        self.cost_fn: CostFunc | None = rule.cost if callable(rule.cost) else None
        self.cost = 1.0 if callable(rule.cost) else float(rule.cost)
        self.costs = (self.cost,) * len(rule.limits)
        self.message_limits = rule.message_limits
        self.message_costs = (1.0,) * len(rule.message_limits)
        self.shadow = rule.shadow
        # This rule's entries of the RateLimit-Policy header (none for a shadow rule: it never applies).
        self.policy = b"" if rule.shadow else policy_value(rule.limits)
        self.keys_cache: dict[str, tuple[str, ...]] = {}
        self.checked_inline = not self.key_is_async and self.cost_fn is None and not self.shadow and bool(self.limits)
        self.one_limit = len(self.limits) == 1

    def storage_keys(self, key: str, message: bool = False) -> tuple[str, ...]:
        """Storage keys of this rule's limits for client ``key``, cached for recent keys (as
        tuples of strings, which the garbage collector stops tracking: no GC pauses that grow with
        the number of clients); a key over ``MAX_KEY_LENGTH`` is cached under its hash, so the
        cache stays small whatever clients send.

        Args:
            key: The client's key.
            message: The keys of the WebSocket message limits instead of the connection ones.
        """
        prefix = self.prefix
        if message:
            scope = self.rule.name + "-msg"
            return tuple([storage_key(prefix, scope, key, limit.suffix) for limit in self.message_limits])
        cache = self.keys_cache
        found = cache.get(key)
        if found is None:
            if len(key) > MAX_KEY_LENGTH:
                # Storage keys hold a long key's hash (safe_key) anyway: cached under the hash, so
                # the cache never holds a client's long key (the storage keys are the same).
                key = safe_key(key)
                found = cache.get(key)
                if found is not None:
                    return found
            name = self.rule.name
            found = tuple([storage_key(prefix, name, key, suffix) for suffix in self.suffixes])
            remember(cache, key, found, _KEYS_CACHE_LIMIT)
        return found


@mypyc_attr(allow_interpreted_subclasses=True)
class RuleSet:
    """Rules compiled once, with matches cached per (method, path), so many rules cost about the
    same as one. ``replace`` swaps the whole table atomically (used by policy reloads).

    Rules match the normalised path (``normalize_path``: repeated slashes merged, dot segments
    resolved), the one the application routes to; the cache is keyed by the path as sent, so a
    cached path costs no normalisation. A path not in the cache is looked up in a segment trie of
    the glob rules, so its cost does not grow with the number of rules.

    Args:
        rules: The rules, in order (bypass rules are checked first).
        prefix: The limiter's storage-key prefix.
    """

    def __init__(self, rules: Sequence[Rule], prefix: str = "rw") -> None:
        self.prefix = prefix
        self._table: tuple[
            tuple[tuple[Rule, CompiledRule], ...],
            dict[tuple[str, str], tuple[CompiledRule, ...]],
            dict[str, tuple[CompiledRule, ...]] | None,
            RuleIndex,
        ]
        self.replace(rules)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(r for r, _ in self._table[0])

    def replace(self, rules: Sequence[Rule]) -> None:
        """Swap in a new table of rules, atomically.

        Args:
            rules: The new rules.
        """
        if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
            raise ConfigurationError(
                f"rules must be a list of Rule objects, got {type(rules).__name__} {rules!r:.60}; a policy file or "
                "Policy is given as policy=, e.g. PolicyMiddleware(app, limiter, policy='policy.toml')"
            )
        for rule in rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"rules must be Rule objects, got {type(rule).__name__}")
        compiled = tuple((r, CompiledRule(r, self.prefix)) for r in rules)
        # Bypass rules first: a bypass match skips everything.
        ordered = tuple(sorted(compiled, key=lambda rc: not rc[0].bypass))
        # When no rule names methods, an HTTP request's match depends on its path alone: cached by
        # the path string (its hash is kept), with no (method, path) tuple to build and hash.
        by_path: dict[str, tuple[CompiledRule, ...]] | None = (
            {} if all(r.methods is None and type(r).applies is Rule.applies for r in rules) else None
        )
        self._table = (ordered, {}, by_path, RuleIndex([_placement(r) for r, _ in ordered]))

    def match(self, method: str, path: str, websocket: bool = False) -> tuple[CompiledRule, ...]:
        """The compiled rules a request matches (none when a bypass rule matches).

        Args:
            method: The HTTP method, in any case.
            path: The request path (``scope["path"]``), matched once normalised (``normalize_path``).
            websocket: Match WebSocket rules instead of HTTP ones.
        """
        table = self._table
        by_path = table[2]
        if by_path is not None and not websocket:
            found = by_path.get(path)
            if found is None:
                found = _lookup(table[0], table[3], method, normalize_path(path), websocket)
                if len(path) <= MAX_CACHED_PATH:
                    remember(by_path, path, found, _MATCH_CACHE_LIMIT)
            return found
        cache = table[1]
        cache_key = ("WS" if websocket else method, path)
        found = cache.get(cache_key)
        if found is None:
            # Servers pass the method as sent, and frameworks route ``post`` as ``POST``.
            found = _lookup(table[0], table[3], method.upper(), normalize_path(path), websocket)
            if len(path) <= MAX_CACHED_PATH:
                remember(cache, cache_key, found, _MATCH_CACHE_LIMIT)
        return found


def _placement(rule: Rule) -> Placement:
    """Where ``rule`` goes in the trie (``rule_index.placement``); ``None``, tried on every path,
    for a subclass with its own ``applies``."""
    if type(rule).applies is not Rule.applies:
        return None
    return placement(rule.path, rule.pattern)


def _lookup(
    rules: tuple[tuple[Rule, CompiledRule], ...], index: RuleIndex, method: str, path: str, websocket: bool
) -> tuple[CompiledRule, ...]:
    """Match the rules ``index`` gives as candidates for ``path`` (a cache miss): the same answer as
    trying every rule in order."""
    bare = _without_slash(path)
    positions = index.candidates(path)
    if bare is not None:
        positions = sorted(set(positions).union(index.candidates(bare)))
    matched: list[CompiledRule] = []
    for position in positions:
        rule, compiled = rules[position]
        if rule.websocket != websocket and not rule.bypass:
            continue
        if rule.bypass:
            if rule.applies(method, path):
                return ()
        elif rule.applies(method, path) or (bare is not None and rule.applies(method, bare)):
            matched.append(compiled)
    return tuple(matched)


def _without_slash(path: str) -> str | None:
    """``path`` without its trailing slash (``None``: it has none, or is ``/``). A limit on a path
    applies to both spellings, since some applications serve both (``StaticFiles`` serves
    ``/files/a.txt/`` as ``/files/a.txt``); a bypass applies to the spelling it matches only."""
    return path[:-1] if len(path) > 1 and path[-1] == "/" else None


_policies: dict[tuple[CompiledRule, ...], bytes] = {}


def policy_of(rules: tuple[CompiledRule, ...]) -> bytes:
    """The ``RateLimit-Policy`` value for a request matched by ``rules``: every limit that applied.

    Args:
        rules: The rules a request matched.
    """
    if len(rules) == 1:
        return rules[0].policy
    found = _policies.get(rules)
    if found is None:
        found = b", ".join([r.policy for r in rules if r.policy])
        remember(_policies, rules, found, _MATCH_CACHE_LIMIT)
    return found
