"""From logits to tokens: the sampler and its filters and bounds, n choices and forks, beam search."""
