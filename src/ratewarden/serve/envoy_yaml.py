"""Reading envoyproxy/ratelimit's YAML by its composed nodes (``Reader``): each value checked for its
type where it is read, and every problem collected with its field's path and line, so one error
lists them all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..algorithms import ALGORITHMS, AlgorithmName, algorithm_name, unknown_algorithm
from ..policy.schema import Problem

if TYPE_CHECKING:
    import yaml

__all__ = ["Reader", "kind_of"]

_UINT32_MAX = 2**32 - 1


class Reader:
    """Walks the composed YAML nodes, collecting every problem with its line."""

    def __init__(self, source: str) -> None:
        import yaml

        self.yaml = yaml
        self.source = source
        self.problems: list[Problem] = []

    def error(self, path: str, node: yaml.Node | None, message: str) -> None:
        line = int(node.start_mark.line) + 1 if node is not None else None
        self.problems.append(Problem(path, message, line, self.source))

    def mapping(self, node: yaml.Node, path: str, allowed: Sequence[str]) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The mapping's fields by name; unknown and repeated fields are problems."""
        if not isinstance(node, self.yaml.MappingNode):
            self.error(path, node, f"expected a mapping of fields ({', '.join(allowed)}), got {kind_of(node)}")
            return {}
        found: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            name = str(key_node.value) if isinstance(key_node, self.yaml.ScalarNode) else "?"
            where = f"{path}.{name}" if path else name
            if name not in allowed:
                hint = _close(name, allowed)
                self.error(where, key_node, f"unknown field {name!r}{hint}; allowed here: {', '.join(allowed)}")
            elif name in found:
                self.error(where, key_node, f"field {name!r} is given twice")
            else:
                found[name] = (key_node, value_node)
        return found

    def string(self, node: yaml.Node, path: str) -> str:
        if isinstance(node, self.yaml.ScalarNode) and node.tag != "tag:yaml.org,2002:null":
            return str(node.value)
        if isinstance(node, self.yaml.ScalarNode):
            return ""
        self.error(path, node, f"expected a string, got {kind_of(node)}")
        return ""

    def boolean(self, node: yaml.Node, path: str) -> bool:
        if isinstance(node, self.yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:bool":
                return str(node.value).lower() in ("true", "yes", "on", "y")
            if node.tag == "tag:yaml.org,2002:null":
                return False
        self.error(path, node, f"expected true or false, got {_describe(node)}")
        return False

    def uint32(self, node: yaml.Node, path: str) -> int:
        if isinstance(node, self.yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int":
            try:
                number = int(str(node.value).replace("_", ""), 0)
            except ValueError:
                number = -1
            if 0 <= number <= _UINT32_MAX:
                return number
        self.error(path, node, f"expected a whole number from 0 to {_UINT32_MAX}, got {_describe(node)}")
        return 0

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if isinstance(node, self.yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, self.yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return []
        self.error(path, node, f"expected a list, got {kind_of(node)}")
        return []

    def algorithm(self, node: yaml.Node, path: str) -> AlgorithmName | None:
        name = self.string(node, path)
        if name in ALGORITHMS:
            return algorithm_name(name)
        self.error(path, node, unknown_algorithm(name))
        return None


def kind_of(node: yaml.Node) -> str:
    """What ``node`` is, for a message: a mapping, a list, or its scalar value."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _describe(node)


def _describe(node: yaml.Node) -> str:
    import yaml

    if isinstance(node, yaml.ScalarNode):
        return repr(node.value)
    return kind_of(node)


def _close(name: str, allowed: Sequence[str]) -> str:
    import difflib

    match = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
