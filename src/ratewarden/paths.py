"""Path patterns and paths as rules see them: a rule's glob (or regex) compiled, and a request's
path normalised to the one the application routes to."""

from __future__ import annotations

import re

from .errors import ConfigurationError

__all__ = ["compile_path", "normalize_path"]

#: The wildcards of a glob pattern, longest first: ``/**`` (any number of segments, or none),
#: ``**`` (any text) and ``*`` (one segment).
WILDCARDS = ("/**", "**", "*")


def compile_path(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    """Compile a path pattern: ``*`` is one segment, ``**`` any number (``/api/**`` also matches
    ``/api``), a ``re:`` prefix or a compiled pattern is a regex matched against the whole path.

    Args:
        pattern: The path pattern, or a compiled regex.
    """
    if isinstance(pattern, re.Pattern):
        return pattern
    if pattern.startswith("re:"):
        try:
            return re.compile(pattern[3:])
        except re.error as exc:
            raise ConfigurationError(f"invalid regex in rule path {pattern!r}: {exc}") from None
    if not pattern.startswith("/") and not pattern.startswith("*"):
        raise ConfigurationError(f"rule path {pattern!r} must start with '/' (e.g. '/api/**') or 're:'")
    return re.compile(glob_regex(glob_tokens(pattern)))


def glob_tokens(pattern: str) -> list[str]:
    """A glob pattern cut into its wildcards (``"/**"``, ``"**"``, ``"*"``) and the runs of literal
    text between them."""
    tokens: list[str] = []
    literal = 0  # where the current run of literal text began
    i = 0
    while i < len(pattern):
        if pattern.startswith("/**", i):
            wildcard = "/**"
        elif pattern.startswith("**", i):
            wildcard = "**"
        elif pattern[i] == "*":
            wildcard = "*"
        else:
            i += 1
            continue
        if literal < i:
            tokens.append(pattern[literal:i])
        tokens.append(wildcard)
        i += len(wildcard)
        literal = i
    if literal < len(pattern):
        tokens.append(pattern[literal:])
    return tokens


def glob_regex(tokens: list[str]) -> str:
    """The regex of a glob pattern's tokens (``re.escape`` of a run is that of its characters)."""
    out: list[str] = []
    for token in tokens:
        if token == "/**":
            out.append("(?:/.*)?")
        elif token == "**":
            out.append(".*")
        elif token == "*":
            out.append("[^/]+")
        else:
            out.append(re.escape(token))
    return "".join(out)


def normalize_path(path: str) -> str:
    """The path an application routes a request to, as rules match it: repeated slashes merged,
    then ``.`` and ``..`` segments resolved (RFC 3986 remove_dot_segments; ``..`` at the root stays
    at the root). A trailing slash is kept (a limit on ``/a`` also applies to ``/a/``: see
    ``RuleSet.match``); percent-escapes are left alone (the server already
    decoded ``scope["path"]``: decoding again would match a path the application does not route
    to). A path not starting with ``/`` is returned as it is.

    Args:
        path: The request path (``scope["path"]``).
    """
    if not path.startswith("/") or ("//" not in path and "/." not in path):
        return path
    out: list[str] = []
    trailing = False  # whether the last segment read leaves a directory ("/a/b/", "/a/b/.")
    for segment in path[1:].split("/"):
        if segment == "" or segment == ".":
            trailing = True
        elif segment == "..":
            if out:
                out.pop()
            trailing = True
        else:
            out.append(segment)
            trailing = False
    joined = "/" + "/".join(out)
    return joined + "/" if trailing and out else joined
