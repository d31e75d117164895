"""The segment trie of glob rules: which rules a path not in the match cache may match, without
trying every rule (such a path is chosen by the client, so its cost must not grow with the number
of rules)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .paths import WILDCARDS, glob_regex, glob_tokens

__all__ = ["RuleIndex", "placement"]

#: Where a rule goes in the trie (``placement``): the leading path segments of every path it
#: matches, and whether it matches exactly that path (a literal pattern); ``None``: everywhere.
Placement = tuple[list[str], bool] | None


class _Node:
    """A segment trie node: its children by path segment, and rules placed at it."""

    __slots__ = ("below", "children", "here")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        # Rule positions: candidates for every path that reaches this node (``below``), or only for
        # a path that ends here (``here``: whole-literal patterns).
        self.below: list[int] = []
        self.here: list[int] = []


class RuleIndex:
    """The rules a path may match, without trying every rule (a path not in the match cache is
    chosen by the client, so its cost must not grow with the number of rules).

    A glob rule is placed in a trie of path segments at its leading literal segments (a whole
    literal path, or the segments before its first wildcard); a path's candidates are the rules
    placed along its segments, each then checked with ``Rule.applies``, so answers are the same
    as trying every rule in order. Regex rules, and rules of a subclass overriding ``applies``, are
    candidates for every path.

    Args:
        placements: Where each rule goes (``placement``), in matching order (a candidate is its
            position here); ``None`` for a rule tried on every path.
    """

    def __init__(self, placements: Sequence[Placement]) -> None:
        self.root = _Node()
        self.everywhere: list[int] = []  # regex rules, overridden applies: always candidates
        for position, placed in enumerate(placements):
            if placed is None:
                self.everywhere.append(position)
                continue
            segments, whole = placed
            node = self.root
            for segment in segments:
                child = node.children.get(segment)
                if child is None:
                    child = _Node()
                    node.children[segment] = child
                node = child
            if whole:
                node.here.append(position)
            else:
                node.below.append(position)

    def candidates(self, path: str) -> list[int]:
        """The positions of the rules ``path`` may match, in order (a superset of those it matches).

        Args:
            path: The (normalised) request path.
        """
        found = list(self.everywhere)
        node = self.root
        found.extend(node.below)
        ended = True
        for segment in path.split("/"):
            child = node.children.get(segment)
            if child is None:
                ended = False
                break
            node = child
            found.extend(node.below)
        if ended:
            found.extend(node.here)
        if len(found) > 1:
            found.sort()
        return found


def placement(path: str | re.Pattern[str], pattern: re.Pattern[str]) -> Placement:
    """Where a rule on ``path`` (compiled to ``pattern``) goes in the trie: the path segments every
    path it matches starts with, and whether its pattern is a literal path (matching that path
    only); ``None`` when it must be tried on every path (a regex, a pattern that is not its path's
    glob).

    Args:
        path: The rule's path pattern (``Rule.path``).
        pattern: What it was compiled to (``Rule.pattern``).
    """
    if not isinstance(path, str) or path.startswith("re:"):
        return None
    tokens = glob_tokens(path)
    if pattern.pattern != glob_regex(tokens):
        return None
    first = tokens[0]
    literal = first not in WILDCARDS
    if literal and len(tokens) == 1:
        return first.split("/"), True
    segments = first.split("/") if literal else [""]
    # The literal text before the first wildcard ends inside a segment unless a "/**" follows it
    # and then the end or literal text starting with "/": "/api/**" and "/api/**/x" match "/api..."
    # only where a segment ends after "api"; "/api/**x" and "/api/**/**x" also match "/apix".
    after = 1 if literal else 0
    if tokens[after] == "/**" and (
        after + 1 == len(tokens) or (tokens[after + 1] not in WILDCARDS and tokens[after + 1].startswith("/"))
    ):
        return segments, False
    segments.pop()
    return segments, False
