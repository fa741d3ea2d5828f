"""weir_bench.experiments.prefill_overlap: other requests' first tokens inside each decode window."""

from __future__ import annotations

from weir_bench.experiments.prefill_overlap import StreamTimes, prefills_in_decode, request_times


def test_waves_of_equal_requests_count_no_prefill_inside_a_decode() -> None:
    # two waves of three: every first token of a wave before any of its decodes, the next wave
    # after the last token of this one
    # (their first tokens reach the client a few ms apart: one step, not a prefill waited for)
    waves = [StreamTimes(w * 10.0 + 2.0 + i * 0.003, w * 10.0 + 8.0, 61) for w in range(2) for i in range(3)]
    assert prefills_in_decode(waves) == 0.0


def test_staggered_requests_count_the_first_tokens_that_came_while_they_decoded() -> None:
    # each request decodes for 3.5 s; one first token every second: the next three land inside
    staggered = [StreamTimes(float(i), i + 3.5, 36) for i in range(8)]
    counts = [3, 3, 3, 3, 3, 2, 1, 0]  # the last ones have fewer after them
    assert prefills_in_decode(staggered) == sum(counts) / 8


def test_no_requests_is_none_and_guidellm_requests_are_read() -> None:
    assert prefills_in_decode([]) is None
    report = {
        "benchmarks": [
            {
                "requests": {
                    "successful": [
                        {
                            "request_start_time": 100.0,
                            "time_to_first_token_ms": 250.0,
                            "request_end_time": 103.0,
                            "output_tokens": 64,
                        },
                        {
                            "request_start_time": 100.5,
                            "time_to_first_token_ms": None,
                            "request_end_time": 101.0,
                        },
                    ]
                }
            }
        ]
    }
    [times] = request_times(report)
    assert times == StreamTimes(100.25, 103.0, 64)
    assert abs(times.mean_gap_s - 2.75 / 63) < 1e-12
