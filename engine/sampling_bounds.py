"""The bounds of the sampling parameters, declared once.

`weir.engine.request.SamplingParams` checks them, and the gateway's request bodies
(`weir.gateway.api.openai_bodies`) declare them, so `/openapi.json` states them too. This module imports
nothing: the engine and the gateway both read it, and the engine never imports the gateway.
The bounds are the "input bounds" of docs/security.md: everything that costs engine time has one.
"""

from __future__ import annotations

# The seeds a sampling generator accepts (torch.Generator.manual_seed): a signed or unsigned
# 64-bit integer.
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1  # token ids, max_tokens, top_k: what a tensor index holds

MAX_N = 16  # choices per prompt, and beams per prompt with use_beam_search
MAX_LOGPROBS = 20  # top alternatives per token
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 512  # per stop string; each is matched against the tail of every sequence
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
LOGIT_BIAS_MIN, LOGIT_BIAS_MAX = -100.0, 100.0
PENALTY_MIN, PENALTY_MAX = -2.0, 2.0  # presence_penalty and frequency_penalty
LENGTH_PENALTY_MIN, LENGTH_PENALTY_MAX = -10.0, 10.0  # beam search
