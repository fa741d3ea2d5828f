"""From tokens back to text: incremental detokenization, stop strings, a request's output side (the tokenizer's fingerprint and engine copy: engine/engine_tokenizer.py)."""
