"""The conformance table: each case is a rule set, a request sent ``sends`` times, and what every
door answers: the status of each send, every rate-limit header of the last answer, and what the
store was charged. ``test_matrix`` runs each case through every door of ``doors.DOORS``.

A door that must answer otherwise says so in ``Case.differences`` (door name -> ``Difference``),
never by being left out: a case a door cannot express at all is a ``Difference`` with ``skip``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

#: Every store in the matrix reads this clock: mid-second, 40.5 s into a minute, so fixed windows
#: never roll over during a case and ``t`` is known: 1 for a 1 s window, 20 for a minute.
NOW = 1_000_000.5

#: The headers compared, by lower-case name. ``None`` in an expectation: the header is absent.
TRACKED = (
    "ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
    "retry-after", "ratelimit-shadow",
)
#: In an expectation: present, any value.
ANY = "<any>"


@dataclass(frozen=True)
class RuleSpec:
    """One rule, as every door declares it (``Rule``, a policy file's ``[[rules]]``, Flask's
    ``@limit``, Django's ``RULES``). ``key``: ``ip``, ``header:<Name>`` or ``query:<name>``."""

    name: str
    path: str = "/api/**"
    rate: str = "3/min"
    methods: tuple[str, ...] = ()
    key: str = "ip"
    cost: int = 1
    shadow: bool = False
    bypass: bool = False


@dataclass(frozen=True)
class Envoy:
    """The case in Envoy's terms (gRPC ``ShouldRateLimit``): a configuration of domain ``case``,
    the request's descriptors (lists of (key, value)) and its ``hits_addend``; ``names`` maps each
    rule name to the limit name Envoy's headers carry."""

    config: str
    descriptors: tuple[tuple[tuple[str, str], ...], ...]
    hits: int = 0
    names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Difference:
    """How one door answers a case otherwise, and why (shown in docs/architecture.md)."""

    why: str
    skip: bool = False  # the door cannot express the case
    statuses: tuple[int, ...] | None = None
    headers: Mapping[str, str | None] = field(default_factory=dict)  # replaces these expectations
    charged: Mapping[str, int] | None = None
    xfail: str = ""  # a known discrepancy not fixed yet: strict xfail with this reason


@dataclass(frozen=True)
class Case:
    """One row of the matrix."""

    id: str
    rules: tuple[RuleSpec, ...]
    statuses: tuple[int, ...]  # one per send; ``sends`` is its length
    headers: Mapping[str, str | None]  # the last answer's TRACKED headers; a missing name means absent
    charged: Mapping[str, int]  # units charged to each rate, summed over every key
    method: str = "GET"
    path: str = "/api/items"
    query: str = ""
    request_headers: Mapping[str, str] = field(default_factory=dict)
    client: str = "10.0.0.1"
    cost: int = 1  # the request's own cost: JSON /v1/check's ``cost``, gRPC's ``hits_addend``
    fault: str = ""  # the store fails every check: "timeout", "error" or "corrupt" (``doors.Backend``)
    on_error: str = "open"  # the limiter's: "open" (its insurance limiter decides) or "closed" (503)
    crashing_store: bool = False  # every check raises RuntimeError (a bug); the limiter fails open
    envoy: Envoy | None = None
    differences: Mapping[str, Difference] = field(default_factory=dict)

    @property
    def sends(self) -> int:
        return len(self.statuses)

    @property
    def failing_store(self) -> bool:
        """Whether the limiter fails closed (``on_error="closed"``)."""
        return self.on_error == "closed"

    def expected(self, door: str) -> tuple[tuple[int, ...], dict[str, str | None], Mapping[str, int]]:
        """(statuses, headers, charged) this door should give: the row's, with its difference."""
        headers: dict[str, str | None] = {name: self.headers.get(name) for name in TRACKED}
        statuses, charged = self.statuses, self.charged
        diff = self.differences.get(door)
        if diff is not None:
            headers.update(diff.headers)
            statuses = diff.statuses or statuses
            charged = diff.charged if diff.charged is not None else charged
        return statuses, headers, charged


# -- documented differences, shared by several rows --------------------------------------------------

NO_SHADOW_HEADER = "only the policy doors (PolicyMiddleware, WSGIPolicyMiddleware, serve) send RateLimit-Shadow"
FLASK_NO_SHADOW = Difference("Flask's @limit has no shadow mode", skip=True)
ENVOY_ONLY_DESCRIPTORS = "Envoy's API has no method, path, query or headers: only descriptors"
ENVOY_SKIP = Difference(ENVOY_ONLY_DESCRIPTORS, skip=True)
ENVOY_ONE_RATE = Difference("Envoy gives a descriptor one rate: several limits are several descriptors (several-rules)", skip=True)
ZERO_RATE = "a rate of 0 is a ConfigurationError; only Envoy's requests_per_unit: 0 refuses every request"
NO_REQUEST_COST = "the request carries no cost of its own (only a rule's cost)"
#: Doors whose requests carry a cost of their own.
REQUEST_COST_DOORS = ("serve-v1-check", "grpc")

POLICY_DOORS = ("asgi-policy", "wsgi-policy", "serve-check", "serve-v1-check", "spoe")
RULE_DOORS = ("asgi", "wsgi", "flask", "django", "sanic", "litestar")
#: Sanic routes the method as sent: "post" is not its POST route (405), though the POST limit counts it.
SANIC_METHOD_AS_SENT = Difference("Sanic's router answers 405 to a lower-case method; the limit charges and refuses it all the same",
                                  statuses=(405, 405, 429))
#: Litestar routes before its middleware runs: "post" is its 405, and no limit sees the request.
LITESTAR_METHOD_AS_SENT = Difference(
    "Litestar's router answers 405 to a lower-case method before any middleware runs: nothing is charged",
    statuses=(405, 405, 405), headers=dict.fromkeys(TRACKED), charged={},
)


def _each(doors: tuple[str, ...], diff: Difference) -> dict[str, Difference]:
    return dict.fromkeys(doors, diff)


def _envoy(*entries: str, descriptors: tuple[tuple[tuple[str, str], ...], ...], hits: int = 0,
           names: Mapping[str, str] | None = None) -> Envoy:
    config = "domain: case\ndescriptors:\n" + "".join(entries)
    return Envoy(config, descriptors, hits, names or {"api": "case.client"})


def _descriptor(key: str, rate: str, extra: str = "", algorithm: str = "fixed_window") -> str:
    count, unit = rate.split("/")
    unit = {"s": "second", "min": "minute", "hour": "hour"}[unit]
    return (
        f"  - key: {key}\n    algorithm: {algorithm}\n"
        f"    rate_limit: {{unit: {unit}, requests_per_unit: {count}}}\n{extra}"
    )


CLIENT = (("client", "10.0.0.1"),)

#: How a store fails in the failure rows (``doors.Backend`` makes each on every store kind).
FAULTS = ("timeout", "error", "corrupt")
GRPC_UNAVAILABLE = Difference("gRPC answers a failed store with UNAVAILABLE, no headers", headers={"retry-after": None})


def _store_fails(fault: str) -> tuple[Case, Case]:
    """A store that fails every check with ``fault``: failing open, the insurance limiter keeps the
    limit (1 of 2 against 1/hour: its own count, on the wall clock); failing closed, 503."""
    envoy = _envoy(_descriptor("client", "1/hour"), descriptors=(CLIENT,))
    return (
        Case(
            f"store-{fault}-open", (RuleSpec("api", rate="1/hour"),), (200, 429),
            {
                "ratelimit-policy": '"api";q=1;w=3600', "ratelimit": ANY,
                "x-ratelimit-limit": "1", "x-ratelimit-remaining": "0", "x-ratelimit-reset": ANY, "retry-after": ANY,
            },
            {}, fault=fault, envoy=envoy,
        ),
        Case(
            f"store-{fault}-closed", (RuleSpec("api", rate="1/hour"),), (503,), {"retry-after": "1"}, {},
            fault=fault, on_error="closed", envoy=envoy, differences={"grpc": GRPC_UNAVAILABLE},
        ),
    )


CASES: tuple[Case, ...] = (
    Case(
        "allowed",
        (RuleSpec("api"),),
        (200,),
        {
            "ratelimit-policy": '"api";q=3;w=60', "ratelimit": '"api";r=2;t=20',
            "x-ratelimit-limit": "3", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "20",
        },
        {"3/min": 1},
        envoy=_envoy(_descriptor("client", "3/min"), descriptors=(CLIENT,)),
    ),
    Case(
        "refused",
        (RuleSpec("api"),),
        (200, 200, 200, 429),
        {
            "ratelimit-policy": '"api";q=3;w=60', "ratelimit": '"api";r=0;t=20',
            "x-ratelimit-limit": "3", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"3/min": 3},
        envoy=_envoy(_descriptor("client", "3/min"), descriptors=(CLIENT,)),
    ),
    Case(
        "several-limits-allowed",
        (RuleSpec("api", rate="2/s; 100/min"),),
        (200,),
        {
            "ratelimit-policy": '"api-2/s";q=2;w=1, "api-100/min";q=100;w=60',
            "ratelimit": '"api-2/s";r=1;t=1',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "1",
        },
        {"2/s": 1, "100/min": 1},
        differences={"grpc": ENVOY_ONE_RATE},
    ),
    Case(
        "several-limits-refused",
        (RuleSpec("api", rate="2/s; 100/min"),),
        (200, 200, 429),
        {
            "ratelimit-policy": '"api-2/s";q=2;w=1, "api-100/min";q=100;w=60',
            "ratelimit": '"api-2/s";r=0;t=1',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1", "retry-after": "1",
        },
        {"2/s": 2, "100/min": 2},
        differences={"grpc": ENVOY_ONE_RATE},
    ),
    Case(
        "several-rules",
        (RuleSpec("api", rate="5/min"), RuleSpec("items", path="/api/items", rate="2/min")),
        (200, 200, 429),
        {
            "ratelimit-policy": '"api";q=5;w=60, "items";q=2;w=60', "ratelimit": '"items";r=0;t=20',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"5/min": 2, "2/min": 2},
        envoy=_envoy(
            _descriptor("client", "5/min"), _descriptor("items", "2/min"),
            descriptors=(CLIENT, (("items", "10.0.0.1"),)), names={"api": "case.client", "items": "case.items"},
        ),
    ),
    Case(
        "shadow-beside-enforced",
        (RuleSpec("api", rate="5/min"), RuleSpec("trial", rate="1/min", shadow=True)),
        (200, 200),
        {
            "ratelimit-policy": '"api";q=5;w=60', "ratelimit": '"api";r=3;t=20',
            "x-ratelimit-limit": "5", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "20",
            "ratelimit-shadow": '"trial";deny;r=0;t=20',
        },
        {"5/min": 2, "1/min": 1},
        envoy=_envoy(
            _descriptor("client", "5/min"), _descriptor("trial", "1/min", "    shadow_mode: true\n"),
            descriptors=(CLIENT, (("trial", "10.0.0.1"),)),
        ),
        differences={
            **_each(("asgi", "wsgi", "django", "sanic", "litestar", "grpc"), Difference(NO_SHADOW_HEADER, headers={"ratelimit-shadow": None})),
            "flask": FLASK_NO_SHADOW,
        },
    ),
    Case(
        "shadow-only",
        (RuleSpec("trial", rate="1/min", shadow=True),),
        (200, 200),
        {"ratelimit-shadow": '"trial";deny;r=0;t=20'},
        {"1/min": 1},
        envoy=_envoy(_descriptor("trial", "1/min", "    shadow_mode: true\n"), descriptors=((("trial", "10.0.0.1"),),)),
        differences={
            **_each(("asgi", "wsgi", "django", "sanic", "litestar", "grpc"), Difference(NO_SHADOW_HEADER, headers={"ratelimit-shadow": None})),
            "flask": FLASK_NO_SHADOW,
        },
    ),
    Case(
        "no-limit-applies",
        (RuleSpec("open", path="/api/items", bypass=True), RuleSpec("api", rate="1/min")),
        (200, 200),
        {},
        {},
        envoy=_envoy("  - key: client\n    rate_limit: {unlimited: true}\n", descriptors=(CLIENT,)),
    ),
    Case(
        "cost-above-one",
        (RuleSpec("api", rate="10/min", cost=3),),
        (200, 200, 200, 429),
        {
            "ratelimit-policy": '"api";q=10;w=60', "ratelimit": '"api";r=1;t=20',
            "x-ratelimit-limit": "10", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"10/min": 9},
        envoy=_envoy(_descriptor("client", "10/min"), descriptors=(CLIENT,), hits=3),
    ),
    Case(
        "cost-over-the-limit",
        (RuleSpec("api", rate="2/min", cost=3),),
        (429,),
        {
            "ratelimit-policy": '"api";q=2;w=60', "ratelimit": '"api";r=2;t=20',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "20",
        },
        {},
        envoy=_envoy(_descriptor("client", "2/min"), descriptors=(CLIENT,), hits=3),
    ),
    Case(
        "zero-quota",
        (),
        (429, 429),
        {
            "ratelimit-policy": '"case.client";q=0;w=60', "ratelimit": ANY,  # t: the window's end, on the wall clock
            "x-ratelimit-limit": "0", "x-ratelimit-remaining": "0", "x-ratelimit-reset": ANY,
        },
        {},
        envoy=_envoy("  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 0}\n", descriptors=(CLIENT,)),
        differences=_each((*RULE_DOORS, *POLICY_DOORS), Difference(ZERO_RATE, skip=True)),
    ),
    Case(
        "request-cost",
        (RuleSpec("api", rate="10/min"),),
        (200, 200, 200, 429),
        {
            "ratelimit-policy": '"api";q=10;w=60', "ratelimit": '"api";r=1;t=20',
            "x-ratelimit-limit": "10", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"10/min": 9},
        cost=3,
        envoy=_envoy(_descriptor("client", "10/min"), descriptors=(CLIENT,), hits=3),
    ),
    Case(
        "missing-key-value",
        (RuleSpec("api", rate="2/min", key="header:X-API-Key"),),
        (200, 200, 429),
        {
            "ratelimit-policy": '"api";q=2;w=60', "ratelimit": '"api";r=0;t=20',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"2/min": 2},
        differences={"grpc": Difference("Envoy sends no descriptor for a missing header (skip_if_absent)", skip=True)},
    ),
    Case(
        "head-on-get-rule",
        (RuleSpec("api", rate="2/min", methods=("GET",)),),
        (200, 200, 429),
        {
            "ratelimit-policy": '"api";q=2;w=60', "ratelimit": '"api";r=0;t=20',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"2/min": 2},
        method="HEAD",
        differences={"grpc": ENVOY_SKIP},
    ),
    Case(
        "lower-case-method",
        (RuleSpec("api", rate="2/min", methods=("POST",)),),
        (200, 200, 429),
        {
            "ratelimit-policy": '"api";q=2;w=60', "ratelimit": '"api";r=0;t=20',
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "20", "retry-after": "20",
        },
        {"2/min": 2},
        method="post",
        differences={"grpc": ENVOY_SKIP, "sanic": SANIC_METHOD_AS_SENT, "litestar": LITESTAR_METHOD_AS_SENT},
    ),
    Case(
        "repeated-query-values",
        (RuleSpec("api", rate="2/min", key="query:api_key"),),
        (400,),
        {},
        {},
        query="api_key=a&api_key=b",
        differences={"grpc": ENVOY_SKIP},
    ),
    *(row for fault in FAULTS for row in _store_fails(fault)),
    Case(  # a store that raises something other than StoreError is a failed check: never unlimited
        "store-crash-insurance-limits",
        (RuleSpec("api", rate="2/hour"),),
        (200, 200, 429),
        {
            "ratelimit-policy": '"api";q=2;w=3600', "ratelimit": ANY,
            "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": ANY, "retry-after": ANY,
        },
        {},
        crashing_store=True,
        envoy=_envoy(_descriptor("client", "2/hour"), descriptors=(CLIENT,)),
    ),
)


def with_request_cost_differences(case: Case) -> Case:
    """``case`` with the doors whose requests carry no cost listed (for a row with ``cost`` > 1)."""
    if case.cost == 1:
        return case
    skips = {door: Difference(NO_REQUEST_COST, skip=True) for door in (*RULE_DOORS, *POLICY_DOORS)
             if door not in REQUEST_COST_DOORS}
    return replace(case, differences={**skips, **case.differences})


CASES = tuple(with_request_cost_differences(c) for c in CASES)
