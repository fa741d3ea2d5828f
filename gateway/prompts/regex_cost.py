"""What a regex's counted repetitions cost a grammar: the product of nested repetition counts.

xgrammar compiles a counted repetition `x{m,n}` by writing `x` out up to n times, and a repetition
nested in another is written out inside every copy of the outer one. Its masks walk those copies:
a mask's cost grows with the product of the counts along the deepest nesting, not with their sum.
`(((([a-z]{0,256}){0,256}){0,256}){0,256})` is 256^4 ≈ 4.3e9 copies: each of its masks took
minutes (issue 54), while `(([a-z]{0,64}){0,64}){0,16}` (65,536) takes ~20 ms on one core.

`nested_repeat_product` scans the pattern itself (escapes, character classes, groups and
quantifiers), so it needs no regex engine and cannot be fooled by syntax Python's `re` would
reject. `*`, `+` and `?` loop without copies and count 1; `{n}` and `{m,n}` count their upper
bound (`{m,}` its lower one, as that many copies precede the loop). Alternatives of one group
take the largest of their branches.
"""

from __future__ import annotations

import re

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


def nested_repeat_product(pattern: str) -> int:
    """The largest product of counted repetitions along one nesting path of `pattern`."""
    # One frame per open group: the largest cost seen among its items so far.
    stack: list[int] = [1]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "(":
            stack.append(1)
            i += 1
            continue
        if char == ")" and len(stack) > 1:
            inner = stack.pop()
            copies, i = _quantifier(pattern, i + 1)
            stack[-1] = max(stack[-1], inner * copies)
            continue
        if char == "[":
            i = _skip_class(pattern, i)
        elif char == "\\":
            i += 2
        else:
            i += 1
        copies, i = _quantifier(pattern, i)
        stack[-1] = max(stack[-1], copies)
    return max(stack)
