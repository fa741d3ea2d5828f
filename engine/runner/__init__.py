"""From a step's plan to logits: the model runner, CUDA graphs, intra-op threads, grammar masks computed ahead, loading and preparing weights."""
