"""The declared bounds are what Settings enforces: any value inside them is taken from the
environment as given, any value outside is refused with one line naming the setting and its bounds."""

from __future__ import annotations

import annotated_types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.gateway.settings.setting_field import DeclaredSetting
from weir.gateway.settings.settings import Settings, declared
from weir.gateway.settings.settings_parsing import parse_bool

# Settings whose value must also agree with another (metrics_port != port) or with a method.
_CROSS_CHECKED = {"metrics_port", "port"}


def _bounded() -> list[DeclaredSetting]:
    return [
        setting
        for setting in declared()
        if setting.kind in (int, float) and setting.bounds_text() and setting.name not in _CROSS_CHECKED
    ]


def _limits(setting: DeclaredSetting) -> tuple[float | None, bool, float | None, bool]:
    ge, gt = setting.bound(annotated_types.Ge), setting.bound(annotated_types.Gt)
    le, lt = setting.bound(annotated_types.Le), setting.bound(annotated_types.Lt)
    low = ge.ge if ge else gt.gt if gt else None
    high = le.le if le else lt.lt if lt else None
    return low, gt is not None, high, lt is not None


def test_every_number_with_bounds_is_covered() -> None:
    names = {setting.name for setting in _bounded()}
    assert {"lora_slots", "tenant_cache_share", "gil_switch_interval_ms", "max_queued_tokens"} <= names


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_values_inside_the_bounds_are_taken_and_outside_refused(data: st.DataObject) -> None:
    setting = data.draw(st.sampled_from(_bounded()))
    low, low_open, high, high_open = _limits(setting)
    if setting.kind is int:
        inside = st.integers(
            min_value=None if low is None else int(low) + low_open,
            max_value=None if high is None else int(high) - high_open,
        )
    else:
        inside = st.floats(
            min_value=low,
            max_value=high,
            exclude_min=low_open,
            exclude_max=high_open,
            allow_nan=False,
            allow_infinity=False,
        )
    value = data.draw(inside)
    taken = Settings.from_sources({}, {setting.env: repr(value)})
    assert getattr(taken, setting.name) == value
    outside = []
    if low is not None:
        outside.append(low if low_open else low - 1)
    if high is not None:
        outside.append(high if high_open else high + 1)
    bad = data.draw(st.sampled_from(outside))
    with pytest.raises(ValueError) as refused:
        Settings.from_sources({}, {setting.env: str(int(bad) if setting.kind is int else bad)})
    assert str(refused.value).startswith(f"{setting.name} must be {setting.bounds_text()}")
    assert "\n" not in str(refused.value)


def test_bounds_read_as_the_messages_say_them() -> None:
    by_name = {setting.name: setting for setting in declared()}
    assert by_name["lora_slots"].bounds_text() == "in [1, 64]"
    assert by_name["tenant_cache_share"].bounds_text() == "in (0, 1]"
    assert by_name["lease_ttl_s"].bounds_text() == "> 0"
    assert by_name["max_queued_tokens"].bounds_text() == ">= 0"
    assert by_name["served_model_name"].bounds_text() is None


@pytest.mark.parametrize("text", ["on", "ON", "true", "True", "yes", "1", " on "])
def test_parse_bool_reads_every_spelling_of_on(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["off", "OFF", "false", "no", "0"])
def test_parse_bool_reads_every_spelling_of_off(text: str) -> None:
    assert parse_bool(text) is False


@pytest.mark.parametrize("text", ["", "maybe", "2", "onn"])
def test_parse_bool_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="on or off"):
        parse_bool(text)
