"""`otel_rl.configure`'s signature and the settings table are one thing (issue 10)."""

from __future__ import annotations

import inspect
import typing

import pytest

import otel_rl
from otel_rl._internal import config


def _literal_choices(annotation: object) -> set[str]:
    return {arg for part in typing.get_args(annotation) for arg in typing.get_args(part)
            if isinstance(arg, str)}


def test_configure_takes_exactly_the_settings_of_the_table() -> None:
    parameters = inspect.signature(otel_rl.configure).parameters
    assert list(parameters) == [s.name for s in config.TABLE] + ["exporters"]
    for parameter in parameters.values():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, parameter.name
        assert parameter.default is None, parameter.name  # None: not given (env, default)


def test_configure_choices_are_the_tables_choices() -> None:
    hints = typing.get_type_hints(otel_rl.configure, vars(otel_rl) | vars(config)
                                  | {"SpanExporter": object})
    assert _literal_choices(hints["spans"]) == set(config.SPAN_POLICIES)
    assert _literal_choices(hints["protocol"]) == set(config.PROTOCOLS)
    assert _literal_choices(hints["compression"]) == set(config.COMPRESSIONS)
    for setting in config.TABLE:  # every choice the table's parser accepts, the type allows
        if setting.name in ("spans", "protocol", "compression"):
            assert setting.parse(next(iter(_literal_choices(hints[setting.name])))) is not None


def test_configure_documents_every_setting_and_its_variables() -> None:
    doc = otel_rl.configure.__doc__ or ""
    for setting in config.TABLE:
        assert f"``{setting.name}``" in doc
        for variable in setting.env:
            assert f"``{variable}``" in doc, variable
    assert "``exporters``" in doc


def test_the_docstring_is_wrapped_as_textwrap_wraps_at_spaces() -> None:
    # `config._fill` stands in for textwrap (which every process would import for it).
    import textwrap

    texts = [f"- ``{s.name}`` ({', '.join(s.env)}): {s.doc}." for s in config.TABLE]
    texts += ["", "one", "x" * 120 + " short words after a long one", "a " * 200,
              "words, per-record hyphens-kept " * 9]
    for text in texts:
        for width in (20, 60, 96):
            assert config._fill(text, width, "    ") == textwrap.fill(
                text, width, initial_indent="    ", subsequent_indent="      ",
                break_on_hyphens=False, break_long_words=False), (text, width)


def test_resolved_settings_have_one_attribute_per_row() -> None:
    annotated = set(typing.get_type_hints(config.Settings, vars(config) | {"SpanExporter": object}))
    assert annotated == {s.name for s in config.TABLE} | {"traces_endpoint_is_full", "exporters",
                                                          "run_id_given"}
    resolved = config.resolve({}, environ={})
    for setting in config.TABLE:
        if setting.default is not None:
            assert getattr(resolved, setting.name) == setting.default, setting.name


def test_carried_to_workers_is_a_column_without_secrets() -> None:
    assert set(config.CARRIED) <= {s.name for s in config.TABLE}
    assert {"endpoint", "spans", "span_budget", "output_dir"} <= set(config.CARRIED)
    # Carriers can end up in a child's environment: no credentials in them.
    assert not {"headers", "client_key", "client_certificate"} & set(config.CARRIED)


def test_a_misspelt_setting_is_an_error_not_ignored() -> None:
    # A TypeError, as for any misspelt keyword (and mypy flags it); bad values are ValueErrors.
    with pytest.raises(TypeError, match="servce_name"):
        otel_rl.configure(servce_name="trainer")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="unknown otel_rl setting"):
        config.resolve({"servce_name": "trainer"})
