"""One "unset" convention for optional settings: the same in the components, the pipelines and the sweep.

A KFP parameter cannot default to None (kfp.local cannot carry a None default), so an optional setting is unset
by a sentinel of its own type, and unset always means "keep the base torchtune config's value":

    numbers (int, float)   -1        0 is a real value where it is valid (weight_decay 0, lora_dropout 0,
                                     num_warmup_steps 0) and refused with a message where it is not (batch_size 0)
    text                   ""
    lists, mappings        [] / {}
    on/off settings        "auto"    text "auto" | "true" | "false", so that they can keep the base config's value
                                     (a plain bool cannot say "unset")

`settings_from_parameters` is the one place that reads these sentinels; what it returns has None for unset.
"""

from __future__ import annotations

from typing import Any

UNSET_NUMBER = -1
UNSET_TEXT = ""
AUTO = "auto"
SWITCH_VALUES = {"auto": None, "true": True, "false": False}


def switch(name: str, value: Any) -> bool | None:
    """An on/off parameter: "auto" (the base config's), "true" or "false"; a real bool passes as it is."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text not in SWITCH_VALUES:
        raise ValueError(f"{name} must be auto (the base config's), true or false (got {value!r})")
    return SWITCH_VALUES[text]


def value(name: str, given: Any, is_switch: bool = False) -> Any:
    """One parameter value with its sentinel read as None (see the module docstring)."""
    if is_switch:
        return switch(name, given)
    if isinstance(given, bool) or given is None:
        return given
    if isinstance(given, (int, float)):
        return None if given == UNSET_NUMBER else given
    if isinstance(given, (str, list, tuple, dict)) and not given:
        return None
    return given


def settings_from_parameters(
    parameters: dict[str, Any], switches: set[str] | frozenset[str]
) -> dict[str, Any]:
    """Parameter values as settings: each sentinel becomes None (unset), each switch None/True/False."""
    return {name: value(name, given, name in switches) for name, given in parameters.items()}
