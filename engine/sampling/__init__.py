"""From logits to tokens: the sampler and its filters, forks, beam search scoring, and the verification of speculative drafts (n>1 and beam groups are engine/sequence_groups/)."""
