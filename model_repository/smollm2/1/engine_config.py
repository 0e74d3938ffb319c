"""config.pbtxt `parameters` -> EngineArgs.

Each parameter key is an EngineArgs field; its string value is parsed by the field's type
(int, float, bool, JSON dict, or str; "" or "none" is None where None is allowed). Relative
paths in `model` and `tokenizer` are relative to the model's folder. Unknown keys fail the load.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields

PATH_KEYS = ("model", "tokenizer")
# Options of the model process itself, not of the engine: key -> default.
SERVER_KEYS = {"torch_num_threads": "0"}  # 0: torch's default (one thread per core)


def _parse(key: str, value: str, annotation: str):
    ann = annotation.replace(" ", "")
    optional = ann.endswith("|None") or ann.startswith("None|")
    base = ann.replace("|None", "").replace("None|", "")
    if optional and value.strip().lower() in ("", "none", "null"):
        return None
    try:
        if base == "int":
            return int(value)
        if base == "float":
            return float(value)
        if base == "bool":
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if base.startswith("dict"):
            parsed = json.loads(value) if value.strip() else {}
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
            return parsed
    except ValueError as e:
        raise ValueError(f"config parameter {key!r}={value!r} is not a valid {base}: {e}") from None
    return value


def engine_args_from_config(model_config: dict, model_dir: str, engine_args_cls, overrides=None):
    """EngineArgs from the model config's `parameters`; `overrides` (e.g. device) win."""
    known = {f.name: str(f.type) for f in fields(engine_args_cls)}
    kwargs = {}
    for key, entry in (model_config.get("parameters") or {}).items():
        if key in SERVER_KEYS:
            continue
        if key not in known:
            raise ValueError(f"config parameter {key!r} is not an engine option; known: {sorted(known)}")
        kwargs[key] = _parse(key, entry["string_value"], known[key])
    kwargs.update(overrides or {})
    for key in PATH_KEYS:
        value = kwargs.get(key)
        if value and value != "default" and not os.path.isabs(value):
            candidate = os.path.join(model_dir, value)
            if os.path.exists(candidate):
                kwargs[key] = candidate
    return engine_args_cls(**kwargs)


def server_options(model_config: dict) -> dict:
    """The SERVER_KEYS options as ints; $ALRKVD_TORCH_THREADS overrides torch_num_threads.

    On a machine shared with other work, one thread per core oversubscribes the cores and each
    step waits on descheduled threads (7x slower measured on 2 busy cores): set it to 1 there.
    """
    params = model_config.get("parameters") or {}
    out = {}
    for key, default in SERVER_KEYS.items():
        value = params.get(key, {}).get("string_value", default)
        try:
            out[key] = int(value)
        except ValueError:
            raise ValueError(f"config parameter {key!r}={value!r} is not a valid int") from None
    env = os.environ.get("ALRKVD_TORCH_THREADS")
    if env:
        out["torch_num_threads"] = int(env)
    return out
