"""Structured outputs: grammars compiled per tokenizer and the per-sequence token masks."""
