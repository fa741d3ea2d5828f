"""From a request's prompt to token ids and grammars: bounds, the tokenizer workers, grammar compiles."""
