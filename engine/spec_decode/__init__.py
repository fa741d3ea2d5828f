"""Speculative decoding: drafters propose tokens, one target forward verifies them exactly.

- `config`: the method (off, n-gram, draft model), k, and the batch rule, as a frozen dataclass;
- `policy`: how many draft slots each decode gets this step (plain Python, no torch);
- `drafter`: the `Drafter` protocol and its `Draft`; `ngram_drafter` and `draft_model_drafter`
  implement it;
- `verifier`: greedy prefix matching and the rejection-sampling rule over the `Sampler`'s
  exact distributions.

See docs/speculative-decoding.md.
"""
