"""Every setting is declared once: the flags, the WEIR_* names, docs/operations.md's table and the
Helm chart's values, schema and ConfigMap list all come from the declarations and agree with them.

Each test fails when one of those places misses a setting or says another default, bound or
choice; `make settings-reference` rewrites the made parts of the files.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter

from weir.gateway.server.serve_flags import add_serve_arguments
from weir.gateway.settings.setting_field import DeclaredSetting
from weir.gateway.settings.settings import Settings, declared
from weir.gateway.settings.settings_chart import CHART_FLAGS, CHART_VALUES
from weir.gateway.settings.settings_reference import HELPERS, OPERATIONS, SCHEMA, VALUES, main, stale_files

ROOT = Path(__file__).resolve().parents[3]
SECRETS = {"admin_token", "key_pepper", "kv_store_secret", "kv_store_password"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser


def _actions() -> dict[str, argparse.Action]:
    return {action.dest: action for action in _parser()._actions if action.dest != "help"}


def test_the_made_parts_of_the_docs_and_the_chart_are_the_declarations() -> None:
    stale = stale_files(ROOT)
    assert not stale, f"run `make settings-reference`: {sorted(map(str, stale))} differ from the declarations"


def test_check_mode_names_a_file_that_misses_a_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (OPERATIONS, VALUES, SCHEMA, HELPERS):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["--check", "--root", str(tmp_path)]) == 0
    docs = tmp_path / OPERATIONS
    docs.write_text(
        re.sub(r"\n\| `--lease-ttl-s` [^\n]*", "", docs.read_text(encoding="utf-8")), encoding="utf-8"
    )
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert str(OPERATIONS) in capsys.readouterr().err
    assert main(["--root", str(tmp_path)]) == 0  # rewritten
    assert main(["--check", "--root", str(tmp_path)]) == 0
    assert "`--lease-ttl-s`" in docs.read_text(encoding="utf-8")


def test_every_setting_but_the_secrets_is_a_flag_named_after_it() -> None:
    actions = _actions()
    assert set(actions) == {s.name for s in declared()} - SECRETS
    for setting in declared():
        if setting.name in SECRETS:
            assert setting.flag is None and setting.info.secret
            continue
        action = actions[setting.name]
        assert setting.flag in action.option_strings
        assert action.default is None  # so the variable, then the default, apply
        assert action.help is not None
        shown = action.help.replace("%%", "%")  # as argparse prints it
        assert setting.env in shown and setting.default_display().replace("`", "") in shown


def test_every_flag_value_round_trips_through_the_environment() -> None:
    """A setting's default, written as text, reads back the same through its flag and its variable."""
    for setting in declared():
        default = setting.default_value()
        if default is None or setting.name in SECRETS or setting.name in ("data_dir", "cache_dir"):
            continue
        text = _text(default)
        from_env = Settings.from_sources({}, {setting.env: text})
        assert getattr(from_env, setting.name) == default, setting.name
        from_flag = Settings.from_sources(_parser().parse_args([str(setting.flag), text]), {})
        assert getattr(from_flag, setting.name) == default, setting.name


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(getattr(value, "value", value))


def test_env_names_are_unique_and_prefixed() -> None:
    names = [setting.env for setting in declared()]
    assert len(names) == len(set(names)) and all(name.startswith("WEIR_") for name in names)


def test_docs_table_has_one_row_per_setting_with_its_default() -> None:
    page = (ROOT / OPERATIONS).read_text(encoding="utf-8")
    rows = {m.group(2): m.group(1) for m in re.finditer(r"^\| ([^|]+) \| `(WEIR_[A-Z0-9_]+)` \|", page, re.M)}
    assert set(rows) == {setting.env for setting in declared()}
    for setting in declared():
        expected = "(env only)" if setting.flag is None else f"`{setting.flag}"
        assert rows[setting.env].startswith(expected), setting.env
    defaults = dict(re.findall(r"^\| [^|]+ \| `(WEIR_[A-Z0-9_]+)` \| ([^|]+) \|", page, re.M))
    assert defaults["WEIR_MAX_NUM_SEQS"] == "`64`"
    assert defaults["WEIR_PREFIX_CACHING"] == "`on`"


def _chart_config() -> dict[str, Any]:
    values = yaml.safe_load((ROOT / VALUES).read_text(encoding="utf-8"))
    assert isinstance(values, dict)
    config = values["config"]
    assert isinstance(config, dict)
    return config


def _in_chart() -> list[DeclaredSetting]:
    return [setting for setting in declared() if setting.helm_key is not None]


def test_chart_values_hold_every_setting_unset_or_at_the_charts_own_value() -> None:
    config = _chart_config()
    assert set(config) == {setting.helm_key for setting in _in_chart()}
    outside = {setting.name for setting in declared() if setting.helm_key is None}
    assert outside == SECRETS | {"database_url"}  # from secrets.existingSecret, by reference
    for setting in _in_chart():
        value = config[setting.helm_key]
        assert value in (None, "") or CHART_VALUES[str(setting.helm_key)] == value, setting.helm_key


def test_chart_comments_name_each_variable_and_its_default() -> None:
    block = (ROOT / VALUES).read_text(encoding="utf-8").split("\nconfig:\n", 1)[1].split("\n\n", 1)[0]
    comments: dict[str, str] = {}
    words: list[str] = []
    for line in block.splitlines():
        if line.strip().startswith("#"):
            words.append(line.strip().removeprefix("#").strip())
        else:
            comments[line.split(":", 1)[0].strip()] = " ".join(words)
            words = []
    for setting in _in_chart():
        comment = comments[str(setting.helm_key)]
        source = setting.flag if setting.helm_key in CHART_FLAGS else setting.env
        assert comment.startswith(f"{source}:"), setting.helm_key
        assert setting.default_display().replace("`", "") in comment, setting.helm_key


def test_chart_schema_bounds_are_pydantics_own() -> None:
    """The chart's schema says the bounds and choices pydantic's own JSON schema of Settings says."""
    ours = TypeAdapter(Settings).json_schema()["properties"]
    chart = json.loads((ROOT / SCHEMA).read_text(encoding="utf-8"))["properties"]["config"]["properties"]
    assert set(chart) == {setting.helm_key for setting in _in_chart()}
    for setting in _in_chart():
        expected = _flat(ours[setting.name])
        got = chart[str(setting.helm_key)]
        for keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if keyword in expected and not (setting.helm_key == "port" and keyword == "minimum"):
                assert got[keyword] == expected[keyword], (setting.helm_key, keyword)
        if "enum" in expected:
            assert got["enum"] == ["", *expected["enum"]], setting.helm_key


def _flat(schema: dict[str, Any]) -> dict[str, Any]:
    """A property's schema without `anyOf: [..., {type: null}]` and with a `$ref`'s enum inlined."""
    for option in schema.get("anyOf", []):
        if option.get("type") != "null":
            return {**schema, **_flat(option)}
    if "$ref" in schema:
        definitions = TypeAdapter(Settings).json_schema()["$defs"]
        return {**schema, **definitions[schema["$ref"].rsplit("/", 1)[1]]}
    return schema


def test_chart_configmap_lists_every_variable_it_can_set() -> None:
    helpers = (ROOT / HELPERS).read_text(encoding="utf-8")
    listed = re.findall(r'\(list "(WEIR_[A-Z0-9_]+)" ', helpers)
    expected = [s.env for s in _in_chart() if s.helm_key not in CHART_FLAGS]
    assert listed == expected


@pytest.mark.parametrize(("text", "value"), [("on", True), ("off", False), ("true", True), ("0", False)])
def test_former_on_off_settings_read_every_spelling(text: str, value: bool) -> None:
    names = ("admission", "prefix_caching", "gc_freeze", "cpu_kernel_pool", "cpu_decode_layers")
    env = {f"WEIR_{name.upper()}": text for name in names}
    from_env = Settings.from_sources({}, env)
    assert all(getattr(from_env, name) is value for name in names)
    argv = [arg for name in names for arg in (f"--{name.replace('_', '-')}", text)]
    from_flags = Settings.from_sources(_parser().parse_args(argv), {})
    assert all(getattr(from_flags, name) is value for name in names)


def test_a_bad_on_off_value_names_the_variable_or_stops_the_parser() -> None:
    with pytest.raises(ValueError, match="WEIR_PREFIX_CACHING"):
        Settings.from_sources({}, {"WEIR_PREFIX_CACHING": "sometimes"})
    with pytest.raises(SystemExit):
        _parser().parse_args(["--gc-freeze", "maybe"])


def test_refusals_are_one_line_naming_the_setting_and_never_a_secret() -> None:
    with pytest.raises(ValueError) as caught:
        Settings(port=70000, lora_slots=0, admin_token="hunter2")
    message = str(caught.value)
    assert "\n" not in message and "hunter2" not in message
    assert "port must be in [0, 65535], got 70000" in message and "lora_slots must be in [1, 64]" in message
