"""The refusal errors' headers (gateway/admission/refusal_errors.py); the 429s and 400s as the
routes send them are tested through the controller in test_controller.py."""

from __future__ import annotations

import pytest

from weir.gateway.admission.refusal_errors import format_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.02, "20ms"), (0.0, "0ms"), (1.0, "1s"), (1.5, "1.5s"), (360.0, "6m0s"), (3723.0, "1h2m3s")],
)
def test_reset_durations_are_written_like_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
