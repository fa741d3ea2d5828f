"""gateway/prompts/regex_cost.py: the product of nested counted repetitions, as xgrammar writes them out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.gateway.prompts.regex_cost import (
    UNBOUNDED_OUTER,
    nested_repeat_depth,
    nested_repeat_product,
    wide_split_ways,
)


@pytest.mark.parametrize(
    ("pattern", "product"),
    [
        ("abc", 1),
        ("a*b+c?", 1),
        ("[a-z]{0,256}", 256),
        ("(([a-z]{0,64}){0,64}){0,16}", 65536),
        ("(((([a-z]{0,256}){0,256}){0,256}){0,256})", 256**4),
        ("a{3,}", 3),
        ("a{7}", 7),
        ("(a|b{5}){7}", 35),  # alternatives: the largest branch
        ("(a{4})(b{9})", 9),  # siblings: the largest, not the sum
        (r"\(x{9}\){5}", 9),  # escaped parentheses are characters, not a group
        ("[(]{4}(b)", 4),  # so is a parenthesis in a class
        ("[]{]{3}", 3),  # a leading ] in a class is a literal
        ("(a{2,5}?){3}+", 15),  # lazy and possessive quantifiers count the same
        ("a{,5}", 1),  # not a quantifier in xgrammar's or Python's syntax: literal text
        ("((a{2}){3}", 6),  # an unclosed group still counts what it holds
    ],
)
def test_nested_repetitions_multiply(pattern: str, product: int) -> None:
    assert nested_repeat_product(pattern) == product


_atom = st.sampled_from(["a", "[a-z]", r"\d", "."])


@st.composite
def _nested(draw: st.DrawFn) -> tuple[str, int]:
    """A pattern of groups nested `depth` deep, each with a counted repetition, and its product."""
    counts = draw(st.lists(st.integers(1, 300), min_size=1, max_size=5))
    pattern = draw(_atom)
    for count in counts:
        suffix = draw(st.sampled_from(["", "?", "+"]))
        lower = draw(st.integers(0, count))
        pattern = f"(x{draw(_atom)}|{pattern}){{{lower},{count}}}{suffix}"
    sibling = draw(st.sampled_from(["", "b{2}", "[xyz]*"]))
    return pattern + sibling, max(math.prod(counts), 2 if sibling == "b{2}" else 1)


@given(_nested())
def test_the_product_follows_the_deepest_nesting(case: tuple[str, int]) -> None:
    pattern, product = case
    assert nested_repeat_product(pattern) == product


@given(st.text(max_size=200))
def test_any_text_is_scanned_without_error(pattern: str) -> None:
    assert nested_repeat_product(pattern) >= 1


@pytest.mark.parametrize(
    ("pattern", "depth"),
    [
        ("abc", 0),
        ("(a|b)?", 0),  # an optional item is not a repetition
        ("[a-z]{0,8}", 1),
        ("(((a)))+", 1),
        (r"\(x{9}\){5}", 1),
        ("([a-z]*)*", 2),
        ("(a|aa|aaa|[a-z]{1,3}){0,64}", 2),
        ("(a{2,5}?){3}+", 2),
        ("(([a-z]{0,8})*){0,4}", 3),
        ("(((([a-z]{0,256}){0,256}){0,256}){0,256})", 4),
    ],
)
def test_repetitions_stacked_along_one_path_are_counted(pattern: str, depth: int) -> None:
    assert nested_repeat_depth(pattern) == depth


@given(st.lists(st.sampled_from(["*", "+", "{2}", "{0,3}", "?", ""]), min_size=1, max_size=6))
def test_the_depth_counts_each_repeating_quantifier_of_the_nest(quantifiers: list[str]) -> None:
    pattern = "a"
    for q in quantifiers:
        pattern = f"({pattern}){q}"
    assert nested_repeat_depth(pattern) == sum(q not in ("?", "") for q in quantifiers)


@given(st.text(max_size=200))
def test_any_text_has_a_depth(pattern: str) -> None:
    assert nested_repeat_depth(pattern) >= 0


@pytest.mark.parametrize(
    ("pattern", "ways"),
    [
        ("(.{0,8}){0,8}", 72),  # 6.3 s a mask on SmolLM2 (xgrammar 0.2.9)
        ("(.{1,8}){0,8}", 64),
        ("(.{0,16}){0,4}", 68),
        ("(.{0,8})*", 9 * UNBOUNDED_OUTER),  # an unbounded outer repeat
        ("(x|.{0,8}){0,8}", 72),  # any branch
        ("(.{0,8}|x){0,8}", 72),
        ("((.{0,8})){0,8}", 72),  # through a group that does not repeat
        ("([^a]{0,4}){0,8}", 40),  # a negated class is wide
        (r"(\W{0,8}){0,8}", 72),
        ("(.?){0,16}", 32),
        ("(.{0,2}){0,8}", 24),  # 0.16 s a mask
        ("(.{1,8} ){0,8}", 1),  # each item ends in a fixed character: 28 ms
        ("(.{0,8}a){0,8}", 1),
        ("(.{8}){0,8}", 1),  # a fixed count splits one way
        ("(.*){0,8}", 1),  # a loop without copies
        ("(.|..){0,16}", 1),
        ("(([a-z]{0,64}){0,64})", 1),  # a narrow class
        ("[.]{0,8}", 1),
    ],
)
def test_wide_items_ending_a_repeated_group_count_their_splits(pattern: str, ways: int) -> None:
    assert wide_split_ways(pattern) == ways


@given(st.integers(0, 40), st.integers(0, 40), st.integers(2, 300))
def test_the_splits_are_the_inner_range_times_the_outer_count(low: int, extra: int, outer: int) -> None:
    span = extra + 1
    expected = span * outer if span > 1 else 1
    assert wide_split_ways(f"(.{{{low},{low + extra}}}){{0,{outer}}}") == expected
    assert wide_split_ways(f"(.{{{low},{low + extra}}};){{0,{outer}}}") == 1  # ended by a fixed ';'


@given(st.text(max_size=200))
def test_any_text_has_a_split_count(pattern: str) -> None:
    assert wide_split_ways(pattern) >= 1
