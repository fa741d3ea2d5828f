"""Speculative decoding: drafters propose tokens, one target forward verifies them exactly.

- `drafter`: the `Drafter` protocol; `ngram_drafter` and `draft_model_drafter` implement it;
- `engine_step`: a verify step's tokens applied to the scheduler and the engine's counters;
- `factory`: the drafter a `SpeculativeConfig` asks for.

Below this package: the config (`weir.engine.speculative_config`), the counts
(`weir.engine.speculation_tally`), how many draft slots each decode gets
(`weir.engine.scheduling.speculation_policy`) and the verifier with its `Draft`
(`weir.engine.sampling.draft_verifier`: greedy prefix matching and the rejection-sampling rule
over the `Sampler`'s exact distributions), so that the scheduler and the runner use them
without importing this package.

See docs/speculative-decoding.md.
"""
