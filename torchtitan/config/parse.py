"""Reading the config: defaults < TOML file < command-line overrides, each value coerced to its
field's type (a ``Literal`` checked right away), unknown keys named with the closest valid one,
then ``JobConfig.validate()``; ``--help`` lists every option with the values the TOML sets.
``take_flags`` takes a tool's own flags (``torchtitan.plan``, ``torchtitan.generate``) out of the
command line first."""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from torchtitan.config.base import (
    ConfigError,
    _literal_values,
    _not_one_of,
    _toml_value,
    suggest,
)
from torchtitan.config.job import JobConfig, sections
from torchtitan.paths import shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# --------------------------------------------------------------------------- types and coercion

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class _NoValue:
    """A CLI flag given without a value (``--compile.enable``): only a bool may be bare."""


def _field_types(section_cls) -> dict[str, type]:
    return typing.get_type_hints(section_cls)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(key: str, value, tp):
    """Convert a CLI string or TOML value to the field's type, or fail naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "")):
            return None
        return _coerce(key, value, args[0])
    if origin is Literal:
        if isinstance(value, str) and value in typing.get_args(tp):
            return value
        raise _not_one_of(key, value, typing.get_args(tp))
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"--{key} expects a comma-separated list, got {value!r}")
        return [
            _coerce(key, v.strip() if isinstance(v, str) else v, item_tp) for v in items if v != ""
        ]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"--{key} expects {_type_name(tp)}, got {value!r}")


# --------------------------------------------------------------------------- key lookup

_CLI = "command line"


def _all_keys() -> list[str]:
    return [f"{s}.{k}" for s, cls in sections().items() for k in _field_types(cls)]


def _unknown_key(key: str, where: str) -> ConfigError:
    hint = suggest(key, _all_keys()) or "; see --help for the valid keys"
    return ConfigError(f"unknown config key '{key}' ({where}){hint}")


def _set(cfg: JobConfig, key: str, value, where: str) -> None:
    """Set one option; ``where`` is "command line" or the TOML file the value came from."""
    section_name, _, name = key.partition(".")
    known = sections()
    if section_name not in known or name not in _field_types(known[section_name]):
        raise _unknown_key(key, where)
    tp = _field_types(known[section_name])[name]
    if isinstance(value, _NoValue):
        if tp is not bool:
            raise ConfigError(f"--{key} needs a value")
        value = True
    try:
        coerced = _coerce(key, value, tp)
    except ConfigError as e:
        if where == _CLI:
            raise
        raise ConfigError(f"{e} (in {where})") from None
    setattr(getattr(cfg, section_name), name, coerced)


# --------------------------------------------------------------------------- sources


def _split_cli(argv: list[str]) -> list[tuple[str, object]]:
    """['--a.b', '1', '--c.d=2', '--flag'] -> [('a.b', '1'), ('c.d', '2'), ('flag', _NoValue())]."""
    pairs, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; options look like --section.key value")
        arg = arg[2:]
        if "=" in arg:
            key, value = arg.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            key, value = arg, argv[i + 1]
            i += 1
        else:
            key, value = arg, _NoValue()  # bare flag: only valid for bools, checked in _set
        pairs.append((key, value))
        i += 1
    return pairs


def take_flags(argv: list[str], flags: Mapping[str, type]) -> tuple[dict[str, object], list[str]]:
    """Take a tool's own flags out of ``argv``; -> (name -> value of its type, the rest for
    ``parse_args``).

    A flag is ``--name value`` or ``--name=value`` (a bool one may stand alone); its value is the
    next argument whatever it looks like (a prompt may start with "--"). The rest keeps config
    keys (``--section.key``: always a dot), their values and ``-h``/``--help``; any other
    ``--name`` is a mistake, named with the closest flag."""
    taken: dict[str, object] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg[2:].partition("=")
        if not arg.startswith("--") or "." in name or arg == "--help":
            rest.append(arg)
        elif name not in flags:
            close = difflib.get_close_matches(name, list(flags), n=1)
            hint = f"; did you mean --{close[0]}?" if close else "; see --help"
            raise ConfigError(f"unknown option --{name}{hint}")
        elif eq or flags[name] is bool:
            taken[name] = _coerce(name, value if eq else True, flags[name])
        elif i + 1 < len(argv):
            i += 1
            taken[name] = _coerce(name, argv[i], flags[name])
        else:
            raise ConfigError(f"--{name} needs a value")
        i += 1
    return taken, rest


def _read_toml(path: str) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config file not found: {shown(path)}{_bundled_hint(path)}")
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None


def _bundled_hint(path: str) -> str:
    """A relative path is relative to the current directory; name a bundled file of that name."""
    bundled = Path(__file__).resolve().parents[2] / path
    if Path(path).is_absolute() or not bundled.is_file():
        return ""
    return f"; the bundled one is {bundled}"


def _apply_toml(cfg: JobConfig, data: dict, path: str) -> list[str]:
    """Set the options of a parsed TOML file; returns the keys it set."""
    keys = []
    for section_name, section in data.items():
        if not isinstance(section, dict):
            raise _unknown_key(section_name, f"top-level key in {path}; options live in [sections]")
        for name, value in section.items():
            _set(cfg, f"{section_name}.{name}", value, path)
            keys.append(f"{section_name}.{name}")
    return keys


def _field_help(f: dataclasses.Field, tp) -> str:
    allowed = _literal_values(tp)
    if allowed is None:
        return f.metadata["help"]
    quantifier = "any" if typing.get_origin(tp) is list else "one"
    return f"{f.metadata['help']} ({quantifier} of: {', '.join(allowed)})"


def _option_line(key: str, default, current, source: str | None) -> str:
    """``--key (default)``, or ``--key VALUE (default D, from SOURCE)`` where a value is set."""
    if source is None or current == default:
        return f"  --{key} ({_toml_value(default)})"
    return f"  --{key} {_toml_value(current)} (default {_toml_value(default)}, from {source})"


def help_text(cfg: JobConfig | None = None, sources: dict[str, str] | None = None) -> str:
    """Every option with its default and doc; with ``cfg``, the value it has where ``sources``
    (key -> the TOML file or the command line) set one."""
    lines = ["usage: python -m torchtitan.train [--section.key VALUE ...]", ""]
    sources = sources or {}
    for section_name, cls in sections().items():
        lines.append(f"[{section_name}]")
        defaults, types_ = cls(), _field_types(cls)
        current = getattr(cfg, section_name) if cfg is not None else defaults
        for f in dataclasses.fields(cls):
            key = f"{section_name}.{f.name}"
            default, value = getattr(defaults, f.name), getattr(current, f.name)
            lines.append(_option_line(key, default, value, sources.get(key)))
            lines.append(f"      {_field_help(f, types_[f.name])}")
    return "\n".join(lines)


def _help_for(argv: list[str]) -> str:
    """``--help``: the options with the values the TOML file and the other arguments set."""
    try:
        cfg, sources = _build([a for a in argv if a not in ("-h", "--help")])
    except ConfigError as e:  # still help, with the defaults, and why the values are missing
        return f"{help_text()}\n\nnote: showing defaults only: {e}"
    return help_text(cfg, sources)


def _print_help(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `--help | head` closed the pipe; exit quietly, like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _build(argv: list[str]) -> tuple[JobConfig, dict[str, str]]:
    """Defaults < TOML file < command line, unvalidated; -> (config, key -> where it was set)."""
    cli = _split_cli(argv)
    cfg, sources = JobConfig(), {}
    for key, value in cli:
        if key == "job.config_file":
            _set(cfg, key, value, _CLI)
    if cfg.job.config_file:
        path = cfg.job.config_file
        sources.update(dict.fromkeys(_apply_toml(cfg, _read_toml(path), path), path))
    for key, value in cli:
        _set(cfg, key, value, _CLI)
        sources[key] = _CLI
    return cfg, sources


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """Build the config from defaults, the TOML file and CLI overrides, then validate it."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        _print_help(_help_for(argv))
        raise SystemExit(0)
    cfg, _ = _build(argv)
    cfg.validate()
    return cfg
