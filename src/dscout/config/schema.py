"""The configuration's schema: loading and merging YAML files, validation against ``schemas/config.schema.yaml``
with its defaults filled in, and the cross-references the schema cannot express (:func:`dscout.config.checks.
check_references`, run by :func:`validate_config`). Torch-free.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
"""The project folder (``src/dscout/config/`` is three levels below it)."""
SCHEMA_PATH = ROOT / "schemas" / "config.schema.yaml"


def load_schema() -> dict:
    """The JSON schema of the configuration (``schemas/config.schema.yaml``), as a dict."""
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _set_defaults(validator_cls):
    """jsonschema validator that fills ``default`` values (as ``snakemake.utils.validate(set_default=True)``)."""
    validate_props = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    import jsonschema

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})


def validate_config(config: dict, source: str = "config") -> dict:
    """Validate ``config`` against ``schemas/config.schema.yaml`` and fill defaults (in place; returned), then check
    its cross-references (:func:`dscout.config.checks.check_references`).

    Raises:
        ValueError: naming the offending key path, e.g. ``training.lr: 'fast' is not of type 'number'`` or
            ``benchmarks: Additional properties are not allowed ('nmae' was unexpected)``.
    """
    import jsonschema

    schema = load_schema()
    cls = _set_defaults(jsonschema.validators.validator_for(schema))
    errors = sorted(cls(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:10]:
            path = ".".join(str(p) for p in e.absolute_path) or "(top level)"
            lines.append(f"  {path}: {e.message}")
        raise ValueError(f"invalid configuration ({source}):\n" + "\n".join(lines))
    from .checks import check_references  # it reads method keys (dscout.config.stages)

    check_references(config)
    return config


def deep_merge(base: dict, override: dict) -> dict:
    """Recursive dict merge (override wins; lists replaced)."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_config(*paths: str | Path, overrides: dict | None = None) -> dict:
    """Load and merge YAML files (later ones win), apply overrides, validate, fill defaults."""
    cfg: dict = {}
    for p in paths:
        cfg = deep_merge(cfg, yaml.safe_load(Path(p).read_text()) or {})
    if overrides:
        cfg = deep_merge(cfg, overrides)
    return validate_config(cfg, source=", ".join(str(p) for p in paths))


__all__ = ["ROOT", "SCHEMA_PATH", "deep_merge", "load_config", "load_schema", "validate_config"]
