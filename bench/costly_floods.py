"""Issue 54's floods: valid requests that ask the server for as much work as their bounds allow.

Unlike `weir_bench.hostile`'s inputs, most of these are accepted: each is the most expensive request a
tenant may send for one field, so a benchmark can loop one beside a victim's streams and see
whether it stalls them. `COSTLY_FLOODS` maps a `--flood` name to the probes it alternates:

- `regex`: `structured_outputs.regex` with nested counted repetitions, whose compile cost is the
  product of the counts: `REGEX_NESTED_256` (256^4 and four levels deep, past the bounds: it should
  be refused without stalling anyone) and `REGEX_BOUNDED` (admitted, but ambiguous: its masks cost
  ~0.2 s each, which the mask workers must absorb without slowing anyone else). Each request puts a fresh literal in front, so
  the grammar cache never answers it and every request compiles;
- `logit-bias`: `MAX_LOGIT_BIAS` (300) biased tokens, each sampling step adjusts them;
- `stop`: `MAX_STOP_STRINGS` stop strings of `MAX_STOP_CHARS` characters, matched against the
  tail of the text after every token;
- `logprobs`: `top_logprobs` at `MAX_LOGPROBS`, a top-k and its detokenized entries every token;
- `plain`: the control: the same chats with no costly field (`MAX_TOKENS` tokens, `ignore_eos`).
  What the victim loses to it is the price of four more streams on the same cores; what a costly
  flood costs beyond it is the price of its field.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from weir.engine.sampling_bounds import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
)
from weir_bench.hostile import Probe, Target

REGEX_NESTED_256 = "(((([a-z]{0,256}){0,256}){0,256}){0,256})"
# Within the gateway's bounds (two repetitions deep, product 192) but ambiguous: one text splits
# into its items in many ways, so each mask costs ~0.2 s on one core (xgrammar 0.2.9).
REGEX_BOUNDED = "(a|aa|aaa|[a-z]{1,3}){0,64}"
MAX_TOKENS = 32  # each request decodes this much, so the per-token costs are paid every step


def _chat(t: Target, content: str, **extra: Any) -> tuple[str, dict[str, str], bytes]:
    body = {"model": t.model, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS}
    return "/v1/chat/completions", t.auth, json.dumps({**body, **extra}).encode()


def uncached_regex(pattern: str) -> str:
    """`pattern` behind a fresh literal (`q` and 8 random lowercase letters), so no grammar cache
    holds it; the cost of the pattern is unchanged."""
    letters = "".join(chr(ord("a") + b % 26) for b in secrets.token_bytes(8))
    return f"q{letters}{pattern}"


def _regex(pattern: str) -> Any:
    def build(t: Target) -> tuple[str, dict[str, str], bytes]:
        return _chat(t, "Write letters.", structured_outputs={"regex": uncached_regex(pattern)})

    return build


def logit_bias_body() -> dict[str, float]:
    """`MAX_LOGIT_BIAS` entries on token ids 0..299 (every vocabulary has them), +-100 alternating."""
    return {str(i): 100.0 if i % 2 else -100.0 for i in range(MAX_LOGIT_BIAS)}


def stop_strings() -> list[str]:
    """`MAX_STOP_STRINGS` random strings of `MAX_STOP_CHARS` characters (never in the answer, so
    every one is matched to the end)."""
    return [secrets.token_hex(MAX_STOP_CHARS // 2) for _ in range(MAX_STOP_STRINGS)]


def _logit_bias(t: Target) -> tuple[str, dict[str, str], bytes]:
    return _chat(t, "Go on.", logit_bias=logit_bias_body())


def _stop(t: Target) -> tuple[str, dict[str, str], bytes]:
    return _chat(t, "Go on.", stop=stop_strings(), ignore_eos=True)


def _plain(t: Target) -> tuple[str, dict[str, str], bytes]:
    return _chat(t, "Go on.", ignore_eos=True)


def _logprobs(t: Target) -> tuple[str, dict[str, str], bytes]:
    return _chat(t, "Go on.", logprobs=True, top_logprobs=MAX_LOGPROBS, ignore_eos=True)


COSTLY_PROBES: tuple[Probe, ...] = (
    Probe("regex_nested_256", "54", _regex(REGEX_NESTED_256)),
    Probe("regex_admitted_ambiguous", "54", _regex(REGEX_BOUNDED)),
    Probe("logit_bias_300", "54", _logit_bias),
    Probe(f"stop_{MAX_STOP_STRINGS}x{MAX_STOP_CHARS}", "54", _stop),
    Probe(f"top_logprobs_{MAX_LOGPROBS}", "54", _logprobs),
    Probe("plain_chat", "54", _plain),
)

# --flood name -> the probes it alternates (by name)
COSTLY_FLOODS: dict[str, tuple[str, ...]] = {
    "regex": ("regex_nested_256", "regex_admitted_ambiguous"),
    "logit-bias": ("logit_bias_300",),
    "stop": (f"stop_{MAX_STOP_STRINGS}x{MAX_STOP_CHARS}",),
    "logprobs": (f"top_logprobs_{MAX_LOGPROBS}",),
    "plain": ("plain_chat",),
}
