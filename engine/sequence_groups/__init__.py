"""Requests that fan out into several sequences: n>1 choices and beam search groups."""
