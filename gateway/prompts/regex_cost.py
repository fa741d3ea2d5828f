"""What a regex's counted repetitions cost a grammar: the product of nested repetition counts.

xgrammar compiles a counted repetition `x{m,n}` by writing `x` out up to n times, and a repetition
nested in another is written out inside every copy of the outer one. Its masks walk those copies:
a mask's cost grows with the product of the counts along the deepest nesting, not with their sum.
`(((([a-z]{0,256}){0,256}){0,256}){0,256})` is 256^4 ≈ 4.3e9 copies: each of its masks took
minutes (issue 54), while `(([a-z]{0,64}){0,64}){0,16}` (65,536) takes ~20 ms on one core.

Ambiguity multiplies too: a repetition of a repetition of a repetition is written out so that
one text splits into its items in very many ways, and xgrammar's masks follow every split
(`(([a-z]{0,8}){0,8}){0,8}`, product 512, took 2.7 s a mask; `(([a-z]{0,2}){0,2}){0,2}` 9 ms;
`([a-z]{0,64}){0,64}` 32 ms; `([a-z]*)*` 0.1 ms). So `nested_repeat_depth` counts the repetitions
stacked along one path and the gateway refuses three; what two levels can still cost is the
mask workers' problem (engine/runner/mask_prefetch.py), at the lowest CPU priority.

`nested_repeat_product` scans the pattern itself (escapes, character classes, groups and
quantifiers), so it needs no regex engine and cannot be fooled by syntax Python's `re` would
reject. `*`, `+` and `?` loop without copies and count 1; `{n}` and `{m,n}` count their upper
bound (`{m,}` its lower one, as that many copies precede the loop). Alternatives of one group
take the largest of their branches.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_QUANTIFIER = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class that opens at `pattern[i] == "["`."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":  # a leading `]` is a literal
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _quantifier(pattern: str, i: int) -> tuple[int, int]:
    """(copies, index after) of the quantifier at `pattern[i]`, or (1, i) when there is none."""
    if i >= len(pattern):
        return 1, i
    if pattern[i] in "*+?":
        i += 1
        if i < len(pattern) and pattern[i] in "?+":  # lazy or possessive
            i += 1
        return 1, i
    match = _QUANTIFIER.match(pattern, i)
    if match is None:
        return 1, i
    low, comma, high = match.groups()
    copies = int(high) if comma and high else int(low)
    end = match.end()
    if end < len(pattern) and pattern[end] in "?+":
        end += 1
    return max(1, copies), end


def _deepest(pattern: str, empty: int, quantified: Callable[[int, str, int], tuple[int, int]]) -> int:
    """The largest value of `pattern` along one nesting path. Each item (an atom, a class, an
    escape or a closed group) gets `quantified(inner, pattern, i)`: its value from its group's
    (`empty` for an atom) and the quantifier at `i`, with the index after that quantifier."""
    stack: list[int] = [empty]  # one frame per open group: the largest value among its items so far
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "(":
            stack.append(empty)
            i += 1
            continue
        if char == ")" and len(stack) > 1:
            inner, i = stack.pop(), i + 1
        else:
            inner = empty
            i = _skip_class(pattern, i) if char == "[" else i + (2 if char == "\\" else 1)
        value, i = quantified(inner, pattern, i)
        stack[-1] = max(stack[-1], value)
    return max(stack)


def _times_copies(inner: int, pattern: str, i: int) -> tuple[int, int]:
    copies, end = _quantifier(pattern, i)
    return inner * copies, end


def _plus_repeats(inner: int, pattern: str, i: int) -> tuple[int, int]:
    repeats, end = _repeats(pattern, i)
    return inner + repeats, end


def nested_repeat_product(pattern: str) -> int:
    """The largest product of counted repetitions along one nesting path of `pattern`."""
    return _deepest(pattern, 1, _times_copies)


def nested_repeat_depth(pattern: str) -> int:
    """The most repetitions (counted or not: `*`, `+`, `{m,n}`; not `?`) nested in one another
    along one path of `pattern`: `[a-z]{0,8}` is 1, `([a-z]{0,8})*` 2, `(([a-z]{0,8})*){0,4}` 3."""
    return _deepest(pattern, 0, _plus_repeats)


def _repeats(pattern: str, i: int) -> tuple[int, int]:
    """(1 if a repeating quantifier stands at `pattern[i]` else 0, index after it)."""
    optional = i < len(pattern) and pattern[i] == "?"
    copies, end = _quantifier(pattern, i)
    if end == i or optional:
        return 0, end
    return 1, end


# A repeated group whose body (any branch of it) ends in a variable count of a wide atom (`.` or a
# negated class: nearly every token's characters match it) lets one text split into the group's
# items in very many ways, and xgrammar's masks follow every split even two levels deep: measured
# on SmolLM2's vocabulary (xgrammar 0.2.9), `(.{0,8}){0,8}` took 6.3 s a mask, `(.{0,16}){0,4}`
# 3.8 s, `(.{0,8})*` 2.0 s, while `(.{0,2}){0,8}` took 0.16 s and `(.{1,8} ){0,8}` (an item that
# ends in a fixed character) 28 ms. `wide_split_ways` is the inner count's range times the outer
# count (an unbounded outer `*` or `+` counts as UNBOUNDED_OUTER).
UNBOUNDED_OUTER = 16
_WIDE_ESCAPES = ("\\W", "\\D")


def _is_wide(pattern: str, start: int, end: int) -> bool:
    atom = pattern[start:end]
    return atom == "." or atom.startswith("[^") or atom in _WIDE_ESCAPES


def _count_range(pattern: str, i: int) -> tuple[int, int]:
    """(how many different counts the quantifier at `pattern[i]` allows, index after it): `?` 2,
    `{m,n}` n-m+1, `*`/`+` and none 1 (a loop without copies does not multiply the splits)."""
    _, end = _quantifier(pattern, i)
    if end > i and pattern[i] == "?":
        return 2, end
    match = _QUANTIFIER.match(pattern, i)
    if match is None:
        return 1, end
    low, comma, high = match.groups()
    return (max(1, int(high) - int(low) + 1) if comma and high else 1), end


def _outer_count(pattern: str, i: int) -> int:
    """How many items the quantifier at `pattern[i]` repeats a group into (1: it does not repeat)."""
    if i < len(pattern) and pattern[i] in "*+":
        return UNBOUNDED_OUTER
    repeats, _ = _repeats(pattern, i)
    return _quantifier(pattern, i)[0] if repeats else 1


def wide_split_ways(pattern: str) -> int:
    """The largest (range of a wide atom's count ending a branch of a group) x (that group's repeat
    count) in `pattern`: 72 for `(.{0,8}){0,8}`, 1 for `(.{0,8} ){0,8}`."""
    # One frame per open group: the widest trailing range of its closed branches, and of the
    # branch being read (0 once a non-wide item follows the wide one).
    stack: list[list[int]] = [[0, 0]]
    worst = 1
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "(":
            stack.append([0, 0])
            i += 1
            continue
        if char == "|":
            frame = stack[-1]
            frame[0], frame[1] = max(frame[0], frame[1]), 0
            i += 1
            continue
        if char == ")" and len(stack) > 1:
            closed, i = stack.pop(), i + 1
            trailing = max(closed)
            outer = _outer_count(pattern, i)
            if trailing and outer > 1:
                worst = max(worst, trailing * outer)
            _, i = _quantifier(pattern, i)
            stack[-1][1] = trailing if outer == 1 else 0
            continue
        start = i
        i = _skip_class(pattern, i) if char == "[" else i + (2 if char == "\\" else 1)
        wide = _is_wide(pattern, start, i)
        span, i = _count_range(pattern, i)
        stack[-1][1] = span if wide and span > 1 else 0
    return worst
