"""engine/scheduling/slo_trade.py: the step target trades a longer step against first tokens, by goodput.

A machine of `30 ms + 4 ms per decode row + 1.5 ms per prompt token`, a 100 ms ITL target and a
2 s TTFT target (the interactive CPU class)."""

from __future__ import annotations

from weir.engine.latency_targets import LatencyTargets
from weir.engine.request import Request, SamplingParams
from weir.engine.scheduling.slo_trade import MAX_STRETCH, STRETCHES, StepShape, traded_target, ttft_misses

_TARGETS = LatencyTargets(ttft_s=2.0, itl_s=0.1)


def _prompt(rid: str, n: int, arrival_s: float = 0.0) -> Request:
    req = Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=8), arrival_s=arrival_s)
    req.latency = _TARGETS
    return req


def _row(rid: str, last_token_s: float) -> Request:
    req = _prompt(rid, 4)
    req.num_computed_tokens = 4
    req.output_token_ids.append(7)
    req.times.first_token_s = last_token_s
    req.times.token_s.append(last_token_s)
    return req


def _shape(
    rows: int, a: float = 0.03, c: float = 0.004, b: float = 0.0015, max_rows: int | None = None
) -> StepShape:
    return StepShape(
        tokens_within=lambda s: max(32, int((s - a - c * rows) / b)),
        seconds_with=lambda n: a + c * rows + b * n,
        max_rows=max_rows,
    )


def _always(_: Request) -> bool:
    return True


def _never(_: Request) -> bool:
    return False


def test_prompts_in_time_keep_the_target() -> None:
    rows = [_row(f"d{i}", 1.0) for i in range(2)]
    got = traded_target(0.1, 0.8, rows, [_prompt("p", 128, arrival_s=1.0)], 1.0, _shape(2), _always)
    assert got == 0.1


def test_misses_count_the_prompts_served_before() -> None:
    prompts = [_prompt(f"p{i}", 128) for i in range(4)]
    # 512 tokens, 40 tokens a 100 ms step: 20 steps hold 800 tokens, 10 steps 400
    assert ttft_misses(prompts, 0.0, 0.1, 40) == 0
    assert ttft_misses(prompts, 1.0, 0.1, 40) == 1  # 10 steps left: the fourth prompt is late
    assert ttft_misses(prompts, 2.5, 0.1, 40) == 0  # past their deadline: lost, not counted


def test_a_stretch_that_saves_more_first_tokens_than_it_breaks_streams_is_taken() -> None:
    # a heavy overhead (80 ms) leaves a 100 ms step 32 tokens at most: of eight prompts two make
    # their deadline; 200 ms steps feed 77 tokens each and four make it, for one stream's gap
    heavy = _shape(1, a=0.08)
    prompts = [_prompt(f"p{i}", 128) for i in range(8)]
    row = _row("d", 0.5)
    assert ttft_misses(prompts, 0.5, 0.132, 32) == 6
    assert ttft_misses(prompts, 0.5, 0.2, heavy.tokens_within(0.2)) == 4
    got = traded_target(0.1, 0.8, [row], prompts, 0.5, heavy, _always)
    assert 0.1 < got <= MAX_STRETCH * 0.1
    # amortising a 30 ms overhead saves one first token for the one stream: not worth it
    assert traded_target(0.1, 0.8, [row], prompts, 0.5, _shape(1), _always) == 0.1


def test_standing_streams_that_outnumber_the_first_tokens_saved_keep_the_target() -> None:
    prompts = [_prompt(f"p{i}", 128) for i in range(8)]
    rows = [_row(f"d{i}", 0.5) for i in range(8)]
    heavy = _shape(8, a=0.05)
    assert traded_target(0.1, 0.8, rows, prompts, 0.5, heavy, _always) == 0.1
    # the same streams, each having missed a target already: they cost nothing
    assert traded_target(0.1, 0.8, rows, prompts, 0.5, heavy, _never) > 0.1


def test_a_first_token_whose_stream_cannot_keep_its_itl_is_not_worth_a_stretch() -> None:
    prompts = [_prompt(f"p{i}", 128) for i in range(8)]
    row = _row("d", 0.5)
    # a step of the target holds only the row running: a saved prompt's stream would not fit
    assert traded_target(0.1, 0.8, [row], prompts, 0.5, _shape(1, a=0.08, max_rows=1), _always) == 0.1
    assert traded_target(0.1, 0.8, [row], prompts, 0.5, _shape(1, a=0.08, max_rows=9), _always) > 0.1


def test_late_prompts_get_the_shortest_stretch_where_every_row_overruns_anyway() -> None:
    # a loaded machine: three decode rows alone take 127 ms against the 100 ms target
    loaded = _shape(3, a=0.09, c=0.0127, b=0.0045)
    rows = [_row(f"d{i}", 3.0) for i in range(3)]
    late = [_prompt("p", 128, arrival_s=0.0)]  # its deadline passed at 2 s
    assert traded_target(0.1, 0.8, rows, late, 3.0, loaded, _never) == 0.1 * STRETCHES[0]
    # where the rows keep their ITL at the target, a late prompt is not worth their gaps
    assert traded_target(0.1, 0.8, rows, late, 3.0, _shape(3), _never) == 0.1


def test_never_past_the_throughput_step() -> None:
    prompts = [_prompt(f"p{i}", 128) for i in range(8)]
    assert traded_target(0.1, 0.8, [], prompts, 0.5, _shape(0, a=0.08), _always) > 0.1
    assert traded_target(0.1, 0.1, [], prompts, 0.5, _shape(0, a=0.08), _always) == 0.1
