"""One validation of an attention kind's options, whose errors name the option as its caller knows it.

A kind validates its constructor's options in one classmethod, ``check_options(options)``
(``options``: keyword name -> value, None meaning "the default"), built from the checks below.
They raise :class:`OptionError`, whose message names options through ``{name}`` placeholders:
filled with the keyword names when the module is built directly ("power must be ..."), with the
command-line flags when the options come from fairseq's args ("--fourier-power must be ...",
see ``models/attention_options.py``).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence


class OptionError(ValueError):
    """A bad option value. ``template`` names options as ``{option}`` and values as ``{value!r}``."""

    def __init__(self, template: str, **values: Any):
        self.template = template
        self.values = values
        super().__init__(self.render({}))

    def render(self, names: Mapping[str, str]) -> str:
        """The message with each option named by ``names`` (keyword -> flag), else by its keyword."""

        class Names(dict):
            def __missing__(self, key):
                return names.get(key, key)

        return self.template.format_map(Names(self.values))


def check_choice(options: Mapping[str, Any], name: str, allowed: Sequence[str]) -> None:
    value = options.get(name)
    if value is not None and str(value) not in allowed:
        raise OptionError("{%s} must be one of %s, got {value!r}" % (name, ", ".join(allowed)), value=value)


def check_int(options: Mapping[str, Any], name: str, minimum: int, what: str) -> None:
    """An integer >= minimum (``what``: "a positive integer", "a non-negative integer", ...)."""
    value = options.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < minimum:
        raise OptionError("{%s} must be %s, got {value!r}" % (name, what), value=value)


def check_positive(options: Mapping[str, Any], name: str) -> None:
    value = options.get(name)
    if value is None:
        return
    try:
        ok = float(value) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OptionError("{%s} must be positive, got {value!r}" % name, value=value)


def check_non_negative(options: Mapping[str, Any], name: str) -> None:
    """A finite number >= 0."""
    value = options.get(name)
    if value is None:
        return
    try:
        ok = not isinstance(value, bool) and 0 <= float(value) < float("inf")
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OptionError("{%s} must be a finite number >= 0, got {value!r}" % name, value=value)


__all__ = ["OptionError", "check_choice", "check_int", "check_non_negative", "check_positive"]
