"""Stream patterns, as the extension reads them (README, "Wildcards and filters").

A pattern is an exact name, ``'*'`` (every stream), a prefix ending in
``*`` (``'order.*'``: any suffix), or segments of which some are ``*``
(``'order.*.failed'``: exactly one whole segment each). Only an exact name
has a channel of its own; a pattern's channels are those of the streams it
matches, found by name (`name_range`, then `matches`). The database checks
the pattern again (22023), so this module only needs to agree with it on
valid patterns.
"""

from __future__ import annotations

__all__ = ["is_exact", "matches", "name_range"]


def is_exact(pattern: str) -> bool:
    """Whether the pattern names one stream (and so one channel)."""
    return "*" not in pattern


def matches(pattern: str, stream: str) -> bool:
    """Whether `pattern` selects `stream`."""
    if pattern == "*":
        return True
    if "*" not in pattern:
        return pattern == stream
    rest = stream
    segments = pattern.split(".")
    for i, segment in enumerate(segments):
        if i == len(segments) - 1:
            if segment.endswith("*"):
                literal = segment[:-1]
                return "*" not in literal and rest.startswith(literal)
            return "*" not in segment and rest == segment
        if segment == "*":
            end = rest.find(".")
            if end <= 0:
                return False
            rest = rest[end + 1:]
        elif not segment or "*" in segment or not rest.startswith(segment + "."):
            return False
        else:
            rest = rest[len(segment) + 1:]
    return False


def name_range(pattern: str) -> tuple[str, str]:
    """The half-open range ``[low, high)`` of names that can match: those
    starting with the pattern's literal prefix (the text before its first
    ``*``). Stream names are ASCII, all below ``'~'``."""
    prefix = pattern.split("*", 1)[0]
    if not prefix:
        return "", "~"
    if "*" not in pattern:
        return prefix, prefix + "\x01"
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)
