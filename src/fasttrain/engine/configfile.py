"""A TrainConfig from the command line and TOML files, and back to TOML.

    add_arguments(parser)        # one flag per field (config.py), plus --config FILE
    cfg = from_args(args)        # the file's values, the flags given over them
    text = to_toml(cfg)          # the resolved config, saved with every run (config.toml)

A TOML file uses the field names as keys, and flags override the file. Without --config,
`--resume` with `--out DIR` starts from the run's own DIR/config.toml (resume.py says which of its
settings carry over), so that resuming with a flag or two changed extends that run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from fasttrain.engine.config import TrainConfig, field_type, flag
from fasttrain.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field. Defaults are SUPPRESSed so that only flags actually given override
    the TOML file."""
    parser.add_argument("--config", metavar="TOML", help="read settings from a TOML file "
                        "(keys = field names); flags given on the command line win")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(TrainConfig):
        group = f.metadata["group"]
        g = groups.get(group) or groups.setdefault(group, parser.add_argument_group(group))
        text = f.metadata["help"]  # a help that states its default keeps its own wording
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, "help": text if "(default" in text
                              else f"{text} (default: {f.default})"}
        if field_type(f) is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = field_type(f)
            kw["metavar"] = f.name.upper() if not f.metadata.get("choices") else None
            if f.metadata.get("choices"):
                kw["choices"] = f.metadata["choices"]
        g.add_argument(f"--{flag(f.name)}", dest=f.name, **kw)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """The config the flags give, over `--config FILE`; without --config, `--resume` with
    `--out DIR` takes what makes the run that run from its DIR/config.toml (so `--out DIR
    --resume auto --epochs 40` extends that run, not a default one)."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(load_toml(args.config))
    else:
        values.update(_run_config(args))
    names = {f.name for f in fields(TrainConfig)}
    values.update({k: v for k, v in vars(args).items() if k in names})
    _refuse_python_objects(values, getattr(args, "out", None))
    return TrainConfig(**values)


def _refuse_python_objects(values: dict[str, Any], out: str | None) -> None:
    """A run built from Python objects (fasttrain.build(model=net, ...)) records them as
    'python:<name>': nothing the command line can import. Say how to resume it, rather than
    fail to import a module named 'python'."""
    objects = [f"{k}={v}" for k, v in values.items()
               if k in USER_CODE and isinstance(v, str) and v.startswith("python:")]
    if objects:
        raise UserError(f"--out {out}: this run was built in Python ({', '.join(objects)}), "
                        f"which the command line cannot import; resume it from Python with the "
                        f"same objects: fasttrain.build(..., out={str(out)!r}, resume='auto')")


USER_CODE = ("model", "data", "loss", "step", "optimizer", "scheduler")


def _run_config(args: argparse.Namespace) -> dict[str, Any]:
    """On `--resume` with `--out DIR` and no --config: from DIR/config.toml, the settings that
    make the run that run and those a resume may change (resume.py). Its layout, device and
    speed switches stay the flags' own: a run may resume on another layout or machine."""
    from fasttrain.engine.resume import MAY_CHANGE, MUST_MATCH

    out, resume = getattr(args, "out", None), getattr(args, "resume", None)
    saved = Path(out) / "config.toml" if out and resume else None
    if saved is None or not saved.is_file():
        return {}
    keys = {*MUST_MATCH, *MAY_CHANGE, "data_dir"}
    return {k: v for k, v in load_toml(saved, f"the run's {saved}").items() if k in keys}


def load_toml(path: str | Path, label: str | None = None) -> dict[str, Any]:
    """A TrainConfig's fields from a TOML file, checked; errors name it as `label` (default:
    '--config PATH')."""
    p = Path(path)
    label = label or f"--config {p}"
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"{label}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{label}: cannot read it ({e}); check the path") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{label}: not valid TOML ({e}); fix the file") from None
    known = {f.name: f for f in fields(TrainConfig)}
    values = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UserError(f"{label}: unknown key {key!r}; known keys: "
                            f"{', '.join(sorted(known))}")
        want = field_type(known[name])
        if not _type_ok(value, want):
            raise UserError(f"{label}: {key} = {value!r} should be a {want.__name__}")
        values[name] = float(value) if want is float else value
    return values


def _type_ok(value: Any, want: type) -> bool:
    if want is bool:
        return isinstance(value, bool)
    if want is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, want) and not isinstance(value, bool)


def to_toml(cfg: TrainConfig) -> str:
    """The resolved config as TOML (unset optional fields are written as comments)."""
    lines = []
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if v is None:
            lines.append(f"# {f.name} = (not set)")
        elif isinstance(v, bool):
            lines.append(f"{f.name} = {'true' if v else 'false'}")
        elif isinstance(v, int | float):
            lines.append(f"{f.name} = {v!r}")
        else:
            escaped = str(v).replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{f.name} = "{escaped}"')
    return "\n".join(lines) + "\n"
