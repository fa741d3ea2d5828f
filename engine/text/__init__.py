"""From tokens back to text: the engine's tokenizer, incremental detokenization, stop strings, a request's output side."""
