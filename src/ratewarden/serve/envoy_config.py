"""envoyproxy/ratelimit's YAML configuration, loaded as it is, plus ratewarden's ``algorithm``.

One file is one domain::

    domain: messaging
    algorithm: sliding_window       # ratewarden: the domain's default algorithm (optional)
    descriptors:
      - key: message_type
        value: marketing
        descriptors:
          - key: to_number
            algorithm: token_bucket  # ratewarden: this descriptor's algorithm (optional)
            rate_limit: {unit: day, requests_per_unit: 5, name: marketing}

Everything the Go service accepts loads (``shadow_mode``, ``quota_mode``, ``unlimited``,
``replaces``, ``detailed_metric``, ``value_to_metric``, ``share_threshold``, ``metadata``, a wildcard
``*`` ending a value); an unknown field or a bad value is an ``EnvoyConfigError`` naming the file, line
and field. A domain split over several files is an error, or merged with ``merge=True`` (the Go
service's ``MERGE_DOMAIN_CONFIG``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..algorithms import AlgorithmName
from ..limits import DEFAULT_ALGORITHM, Limit
from ..policy.loader import MAX_DEPTH, flow_depth
from ..policy.schema import PolicyError, Problem
from ..rates import Rate
from .envoy_yaml import Reader, kind_of
from .rls_messages import CurrentLimit

if TYPE_CHECKING:
    import yaml

__all__ = [
    "UNIT_SECONDS",
    "EnvoyConfigError",
    "EnvoyDescriptor",
    "EnvoyDomain",
    "EnvoyRateLimit",
    "is_envoy_config",
    "load_envoy_config",
    "load_envoy_configs",
    "parse_envoy_config",
]

#: Seconds per unit, as envoyproxy/ratelimit counts them (a month is 30 days, a year 365).
UNIT_SECONDS: dict[str, int] = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "week": 604800,
    "month": 2592000,
    "year": 31536000,
}

_ROOT_FIELDS = ("domain", "descriptors", "algorithm")
_DESCRIPTOR_FIELDS = (
    "key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
    "value_to_metric", "share_threshold", "metadata", "algorithm",
)
_RATE_LIMIT_FIELDS = ("unit", "requests_per_unit", "unlimited", "name", "replaces")


class EnvoyConfigError(PolicyError):
    """An envoyproxy/ratelimit configuration that cannot be used; each problem names file:line and field."""


@dataclass(frozen=True)
class EnvoyRateLimit:
    """A descriptor's ``rate_limit`` block.

    Args:
        requests_per_unit: Requests allowed per unit (0: every request is over the limit).
        unit: ``second``, ``minute``, ``hour``, ``day``, ``week``, ``month`` or ``year``
            (``""`` when unlimited).
        name: The limit's name (``replaces`` refers to it).
        replaces: Names of the limits this one replaces in a request.
        unlimited: Always OK, nothing counted.
        shadow_mode: Counted, but never limits.
        quota_mode: Counted on its own; a request is refused by its ``quota_mode`` limits only when
            every one of them is over (one with room lets it through).
        algorithm: The ratewarden algorithm counting it.
        full_key: ``domain.key_value.key`` (the Go service's stats key).
    """

    requests_per_unit: int
    unit: str
    name: str = ""
    replaces: tuple[str, ...] = ()
    unlimited: bool = False
    shadow_mode: bool = False
    algorithm: AlgorithmName = DEFAULT_ALGORITHM
    full_key: str = ""
    limit: Limit | None = field(default=None, compare=False, repr=False)
    quota_mode: bool = False
    #: The limit a status reports, made once here rather than for every request.
    current: CurrentLimit = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "current", CurrentLimit(self.name, self.requests_per_unit, self.unit))

    @property
    def period(self) -> int:
        """The unit in seconds."""
        return UNIT_SECONDS[self.unit]


@dataclass
class EnvoyDescriptor:
    """One node of a domain's descriptor tree (the domain itself is the root).

    Args:
        key: The descriptor's key (``""`` for the root).
        value: Its value, ``""`` for any; a ``*`` ending it is a wildcard (a prefix), one before is literal.
        rate_limit: The limit applied when a request's descriptor ends here.
        children: Nested descriptors by ``key`` or ``key_value``, in file order.
        wildcards: ``(key_value pattern, (its prefix, ""))`` of the children ending in ``*``.
        share_threshold: Every value matching this wildcard shares one counter.
        detailed_metric: Accepted (the Go service's metrics option).
        value_to_metric: Accepted (the Go service's metrics option).
        line: Where it is defined.
    """

    key: str = ""
    value: str = ""
    rate_limit: EnvoyRateLimit | None = None
    children: dict[str, EnvoyDescriptor] = field(default_factory=dict)
    wildcards: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    share_threshold: bool = False
    detailed_metric: bool = False
    value_to_metric: bool = False
    line: int = 0


@dataclass
class EnvoyDomain:
    """One loaded configuration file: a domain and its descriptor tree.

    Args:
        domain: The domain's name.
        root: The top-level descriptors (``root.children``).
        source: The file it came from.
        algorithm: The domain's default algorithm.
    """

    domain: str
    root: EnvoyDescriptor
    source: str = "<envoy config>"
    algorithm: AlgorithmName = DEFAULT_ALGORITHM


def is_envoy_config(document: object) -> bool:
    """Whether a parsed YAML document is an envoyproxy/ratelimit configuration (a top-level ``domain``).

    Args:
        document: What ``yaml.safe_load`` returned.
    """
    return isinstance(document, Mapping) and "domain" in document


def parse_envoy_config(text: str, source: str = "<envoy config>") -> EnvoyDomain:
    """Parse one envoyproxy/ratelimit configuration; every problem raises ``EnvoyConfigError``.

    Args:
        text: The YAML text.
        source: Its name, for messages.
    """
    if flow_depth(text) > MAX_DEPTH:
        # PyYAML's scanner is quadratic in flow nesting: refuse before it spends seconds.
        raise EnvoyConfigError([Problem("", f"not valid YAML: nested more than {MAX_DEPTH} levels deep", None, source)])
    try:
        return _parse_envoy_config(text, source)
    except RecursionError:  # PyYAML and the descriptors' reader recurse per nesting level
        raise EnvoyConfigError([Problem("", "not valid YAML: nested too deeply", None, source)]) from None


def _parse_envoy_config(text: str, source: str) -> EnvoyDomain:
    import yaml

    reader = Reader(source)
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = int(mark.line) + 1 if mark is not None else None
        what = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
        raise EnvoyConfigError([Problem("", f"not valid YAML: {what or exc}", line, source)]) from None
    if document is None:
        raise EnvoyConfigError([Problem("", "empty file: expected 'domain:' and 'descriptors:'", None, source)])
    fields = reader.mapping(document, "", _ROOT_FIELDS)
    domain = ""
    before = len(reader.problems)
    if "domain" in fields:
        domain = reader.string(fields["domain"][1], "domain")
    if not domain and len(reader.problems) == before:
        reader.error("domain", fields["domain"][1] if "domain" in fields else document, "config file cannot have empty domain")
    default: AlgorithmName = DEFAULT_ALGORITHM
    if "algorithm" in fields:
        default = reader.algorithm(fields["algorithm"][1], "algorithm") or DEFAULT_ALGORITHM
    root = EnvoyDescriptor(line=1)
    if "descriptors" in fields:
        nodes = reader.sequence(fields["descriptors"][1], "descriptors")
        _load_descriptors(reader, root, nodes, "descriptors", domain + ".", default)
    if reader.problems:
        raise EnvoyConfigError(reader.problems)
    return EnvoyDomain(domain, root, source, default)


def _load_descriptors(
    reader: Reader, parent: EnvoyDescriptor, nodes: Sequence[yaml.Node], path: str, parent_key: str,
    default: AlgorithmName,
) -> None:
    """Load ``nodes`` as ``parent``'s children (the Go service's ``loadDescriptors``)."""
    for index, node in enumerate(nodes):
        _load_descriptor(reader, parent, node, f"{path}[{index}]", parent_key, default)


def _load_descriptor(
    reader: Reader, parent: EnvoyDescriptor, node: yaml.Node, where: str, parent_key: str, default: AlgorithmName
) -> None:
    """Load one descriptor into ``parent.children``."""
    fields = reader.mapping(node, where, _DESCRIPTOR_FIELDS)
    if not fields and not isinstance(node, reader.yaml.MappingNode):
        return
    line = int(node.start_mark.line) + 1

    def value_of(name: str) -> yaml.Node | None:
        found = fields.get(name)
        return found[1] if found is not None else None

    def flag(name: str) -> bool:
        found = value_of(name)
        return reader.boolean(found, f"{where}.{name}") if found is not None else False

    key_node = value_of("key")
    key = reader.string(key_node, f"{where}.key") if key_node is not None else ""
    if not key:
        reader.error(f"{where}.key", key_node or node, "descriptor has empty key")
        return
    value_node = value_of("value")
    value = reader.string(value_node, f"{where}.value") if value_node is not None else ""
    final_key = f"{key}_{value}" if value else key
    full_key = parent_key + final_key
    if final_key in parent.children:
        reader.error(where, node, f"duplicate descriptor composite key '{full_key}'")
        return
    algorithm = default
    algorithm_node = value_of("algorithm")
    if algorithm_node is not None:
        algorithm = reader.algorithm(algorithm_node, f"{where}.algorithm") or default
    shadow = flag("shadow_mode")
    quota = flag("quota_mode")
    share = flag("share_threshold")
    if share and not final_key.endswith("*"):
        reader.error(
            f"{where}.share_threshold", value_of("share_threshold"),
            f"share_threshold can only be used with wildcard values (ending with '*'), but found key '{final_key}'",
        )
    metadata = value_of("metadata")
    if metadata is not None and not isinstance(metadata, reader.yaml.MappingNode):
        reader.error(f"{where}.metadata", metadata, f"expected a mapping, got {kind_of(metadata)}")
    rate_limit = None
    rate_node = value_of("rate_limit")
    if rate_node is not None:
        rate_limit = _load_rate_limit(reader, rate_node, f"{where}.rate_limit", full_key, shadow, algorithm, quota)
    elif algorithm_node is not None:
        reader.error(f"{where}.algorithm", algorithm_node, "algorithm needs a rate_limit on the same descriptor")
    descriptor = EnvoyDescriptor(
        key, value, rate_limit, share_threshold=share, detailed_metric=flag("detailed_metric"),
        value_to_metric=flag("value_to_metric"), line=line,
    )
    if final_key.endswith("*"):  # a prefix; a "*" before the last character is literal, as in the reference
        parent.wildcards.append((final_key, (final_key[:-1], "")))
    children = value_of("descriptors")
    if children is not None:
        nested = reader.sequence(children, f"{where}.descriptors")
        _load_descriptors(reader, descriptor, nested, f"{where}.descriptors", full_key + ".", default)
    parent.children[final_key] = descriptor


def _load_rate_limit(
    reader: Reader, node: yaml.Node, path: str, full_key: str, shadow: bool, algorithm: AlgorithmName, quota: bool
) -> EnvoyRateLimit | None:
    fields = reader.mapping(node, path, _RATE_LIMIT_FIELDS)
    before = len(reader.problems)

    def value_of(name: str) -> yaml.Node | None:
        found = fields.get(name)
        return found[1] if found is not None else None

    unlimited_node = value_of("unlimited")
    unlimited = reader.boolean(unlimited_node, f"{path}.unlimited") if unlimited_node is not None else False
    unit_node = value_of("unit")
    unit = reader.string(unit_node, f"{path}.unit").lower() if unit_node is not None else ""
    valid_unit = unit in UNIT_SECONDS
    if unlimited:
        if valid_unit:
            reader.error(f"{path}.unit", unit_node, "should not specify rate limit unit when unlimited")
    elif not valid_unit:
        reader.error(
            f"{path}.unit", unit_node or node,
            f"invalid rate limit unit '{unit}'; use one of: {', '.join(UNIT_SECONDS)}",
        )
    rpu_node = value_of("requests_per_unit")
    requests = reader.uint32(rpu_node, f"{path}.requests_per_unit") if rpu_node is not None else 0
    name_node = value_of("name")
    name = reader.string(name_node, f"{path}.name") if name_node is not None else ""
    replaces: list[str] = []
    replaces_node = value_of("replaces")
    if replaces_node is not None:
        for index, item in enumerate(reader.sequence(replaces_node, f"{path}.replaces")):
            where = f"{path}.replaces[{index}]"
            item_fields = reader.mapping(item, where, ("name",))
            replaced = reader.string(item_fields["name"][1], f"{where}.name") if "name" in item_fields else ""
            if not replaced:
                reader.error(where, item, "should not have an empty replaces entry")
            elif replaced == name:
                reader.error(where, item, "replaces should not contain name of same descriptor")
            replaces.append(replaced)
    if len(reader.problems) > before:
        return None
    limit = None
    if not unlimited and requests > 0:
        limit = Limit(Rate(requests, float(UNIT_SECONDS[unit])), algorithm, name or full_key)
    return EnvoyRateLimit(
        requests, unit if not unlimited else "", name, tuple(replaces), unlimited, shadow, algorithm, full_key, limit,
        quota,
    )


def load_envoy_config(path: str | os.PathLike[str]) -> EnvoyDomain:
    """Load one envoyproxy/ratelimit configuration file.

    Args:
        path: The YAML file.
    """
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvoyConfigError([Problem("", f"cannot read the file: {exc.strerror or exc}", None, source)]) from None
    return parse_envoy_config(text, source)


def load_envoy_configs(paths: Iterable[str | os.PathLike[str]], merge: bool = False) -> dict[str, EnvoyDomain]:
    """Load files and directories of configurations (``*.yaml``/``*.yml``, sorted) into domains by name.

    A domain defined twice is an error, as in the Go service, unless ``merge``: then the later
    file's top-level descriptors join the domain (the Go service's ``MERGE_DOMAIN_CONFIG``), a
    descriptor defined in both files being an error, and the first file's ``algorithm`` stays the
    domain's default.

    Args:
        paths: Files, or directories whose YAML files are read.
        merge: Merge the files of one domain instead of refusing the second.
    """
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()))
        else:
            files.append(path)
    domains: dict[str, EnvoyDomain] = {}
    problems: list[Problem] = []
    for file in files:
        try:
            loaded = load_envoy_config(file)
        except EnvoyConfigError as exc:
            problems.extend(exc.problems)
            continue
        if loaded.domain in domains:
            first = domains[loaded.domain]
            if merge:
                problems.extend(_merge(first, loaded))
                continue
            problems.append(Problem("domain", f"duplicate domain '{loaded.domain}' (first in {first.source})", None, loaded.source))
            continue
        domains[loaded.domain] = loaded
    if problems:
        raise EnvoyConfigError(problems)
    return domains


def _merge(into: EnvoyDomain, other: EnvoyDomain) -> list[Problem]:
    """Add ``other``'s top-level descriptors to ``into`` (both of one domain); a descriptor both
    define is a problem, as in the Go service."""
    problems: list[Problem] = []
    root = into.root
    for final_key, descriptor in other.root.children.items():
        if final_key in root.children:
            problems.append(Problem(
                "descriptors", f"duplicate descriptor composite key '{into.domain}.{final_key}' (first in {into.source})",
                descriptor.line, other.source,
            ))
            continue
        root.children[final_key] = descriptor
    root.wildcards.extend(w for w in other.root.wildcards if w[0] not in {p for p, _ in root.wildcards})
    if into.source != other.source:
        into.source = f"{into.source}, {other.source}"
    return problems
