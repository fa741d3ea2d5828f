"""From a step's plan to logits: the model runner, attention backends, CUDA graphs, RoPE, intra-op threads, loading and preparing weights."""
