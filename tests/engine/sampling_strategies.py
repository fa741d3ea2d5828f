"""Hypothesis strategies shared by the sampler's tests (test_sampler.py, test_sampling_filters.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from weir.engine.request import SamplingParams

# One sampled row's parameters: any temperature, and top-k, top-p and min-p on or off.
row_params = st.builds(
    SamplingParams,
    temperature=st.floats(0.05, 3.0),
    top_k=st.one_of(st.just(-1), st.integers(2, 50)),
    top_p=st.floats(0.01, 1.0),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
    seed=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
)
