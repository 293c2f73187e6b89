"""Loading a :class:`~doq_lib.config.schema.Config`: the sources (flags, environment, file),
the conversion of their raw values, and :func:`load_config`, which merges and validates them.
"""
from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import yaml

from doq_lib.config.schema import KEY_PREFIXES, KEYS, Config, ConfigError

CONFIG_FILE_NAMES = ("config.yaml", "config.yml", "config.json")
ENV_PREFIX = "DOQ_"


def env_names(key: str) -> tuple[str, str]:
    """The two environment variables of a key, dotted form first (it wins)."""
    upper = key.upper()
    return upper, ENV_PREFIX + upper.replace(".", "_")


# --- raw value conversion ---------------------------------------------------------

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("expected true/false, 1/0 or yes/no")


def _to_int(value: object) -> int:
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            return int(value.strip(), 10)
    except ValueError:
        pass
    raise ValueError("expected an integer")


def _to_float(value: object) -> float:
    try:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                return number
    except ValueError:
        pass
    raise ValueError("expected a number")


def _to_str(value: object) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError("expected a string")


def _to_tuple(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ValueError("expected a comma-separated list")
    return tuple(item.strip() for item in items if item.strip())


_PARSERS: Mapping[type, Callable[[object], Any]] = {
    bool: _to_bool, int: _to_int, float: _to_float, str: _to_str, tuple: _to_tuple,
}


class _Raw(NamedTuple):
    """A value as given, and where it came from (for messages)."""

    value: object
    origin: str


def _convert(raw: Mapping[str, _Raw]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, (value, origin) in raw.items():
        if key not in KEYS:
            problems.append(f"{key}: unknown configuration key (from {origin})")
            continue
        try:
            values[key] = _PARSERS[KEYS[key].type](value)
        except ValueError as exc:
            problems.append(f"{key}: {exc}, got {value!r} (from {origin})")
    return values, problems


def _build(values: Mapping[str, Any], warnings: list[str]) -> Config:
    changes: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        spec = KEYS[key]
        changes.setdefault(spec.section, {})[spec.name] = value
    default = Config()
    sections = {name: replace(getattr(default, name), **given)
                for name, given in changes.items()}
    return replace(default, **sections, warnings=tuple(warnings))


# --- sources ----------------------------------------------------------------------

def _from_flags(flags: Mapping[str, str | None]) -> dict[str, _Raw]:
    return {key: _Raw(value, f"--{key}") for key, value in flags.items()
            if value is not None}


def _from_env(env: Mapping[str, str]) -> dict[str, _Raw]:
    """Dotted names win over ``DOQ_`` names; empty variables count as unset."""
    raw: dict[str, _Raw] = {}
    for key in KEYS:
        for name in env_names(key):
            if env.get(name):
                raw[key] = _Raw(env[name], f"environment {name}")
                break
    return raw


def _find_file(config_path: str | None, cwd: str) -> str | None:
    if config_path:
        if not os.path.isfile(os.path.join(cwd, config_path)):
            raise ConfigError([f"config: file not found: {config_path}"])
        return config_path
    return next((name for name in CONFIG_FILE_NAMES
                 if os.path.isfile(os.path.join(cwd, name))), None)


def _read_yaml(name: str, cwd: str) -> Mapping[Any, Any]:
    try:
        with open(os.path.join(cwd, name), encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except OSError as exc:
        raise ConfigError([f"config: cannot read {name}: {exc.strerror}"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"config: {name} is not valid YAML/JSON: {exc}"]) from exc
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError([f"config: {name} must contain a mapping of keys"])
    return document


def _unknown(name: str, key: str) -> str:
    close = difflib.get_close_matches(key, KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{name}: unknown key {key!r} ignored{hint}"


def _flatten(node: Mapping[Any, Any], prefix: str, name: str,
             out: dict[str, _Raw], warnings: list[str]) -> None:
    """Collect known keys of a nested (or flat dotted) document into ``out``."""
    for raw_key, value in node.items():
        key = prefix + str(raw_key).lower()
        if key in KEYS and value is None:
            warnings.append(f"{name}: key {key!r} has no value; ignored")
        elif key in KEYS:
            if key in out:
                warnings.append(f"{name}: key {key!r} given more than once; last one wins")
            out[key] = _Raw(value, name)
        elif key in KEY_PREFIXES and isinstance(value, Mapping):
            _flatten(value, key + ".", name, out, warnings)
        else:
            warnings.append(_unknown(name, key))


def _from_file(config_path: str | None, cwd: str) -> tuple[dict[str, _Raw], list[str]]:
    name = _find_file(config_path, cwd)
    raw: dict[str, _Raw] = {}
    warnings: list[str] = []
    if name is not None:
        _flatten(_read_yaml(name, cwd), "", name, raw, warnings)
    return raw, warnings


def load_config(flags: Mapping[str, str | None], env: Mapping[str, str],
                config_path: str | None, cwd: str) -> Config:
    """Merge flags > environment > file > defaults into a validated :class:`Config`.

    ``flags`` maps dotted keys to the raw values of the flags explicitly given (None
    or absent = not given). ``config_path`` (relative to ``cwd``) must exist when
    given; otherwise the first of :data:`CONFIG_FILE_NAMES` in ``cwd`` is read, if
    any. Raises :class:`ConfigError` listing every type error, else every
    validation problem. Unknown file keys are reported in ``Config.warnings``.
    """
    file_raw, warnings = _from_file(config_path, cwd)
    values, problems = _convert({**file_raw, **_from_env(env), **_from_flags(flags)})
    if problems:
        raise ConfigError(problems)
    cfg = _build(values, warnings)
    problems = cfg.validate()
    if problems:
        raise ConfigError(problems)
    return cfg
