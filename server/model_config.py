"""A model's config.pbtxt as Triton hands it to model.py, for tools that run the engine outside the server
(benchmarks/bench_itl.py) and for tests: only the `parameters` (the engine options), read from the text;
and a throwaway repository serving one model with some of them changed.

    params = parameters(Path("model_repository/smollm2/config.pbtxt"))  # {"kv_format": {"string_value": "alrkvd"}, ...}
    config = model_config("smollm2")                                    # {"parameters": params}
    repo = variant_repository(tmp, "smollm2", {"max_queue_size": "2"})  # tmp/repository/smollm2, code linked

Standard library only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from server.serve import DEFAULT_MODEL_REPOSITORY

_PARAMETER = re.compile(r'\{\s*key:\s*"([^"]+)",\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"\s*\}\s*\}')


def parameters(pbtxt: Path) -> dict:
    """The `parameters` of a config.pbtxt in the shape Triton hands model.py: {key: {"string_value": value}}."""
    found = _PARAMETER.findall(Path(pbtxt).read_text())
    return {k: {"string_value": json.loads(f'"{v}"')} for k, v in found}  # protobuf text escapes as JSON's


def model_config(model: str, model_repository: Path = DEFAULT_MODEL_REPOSITORY, config_name: str | None = None) -> dict:
    """The part of `model`'s config that model.py reads ({"parameters": ...}): its config.pbtxt, or
    configs/<config_name>.pbtxt (what `alrkvd-serve --gpu` loads for config_name="gpu")."""
    folder = Path(model_repository) / model
    pbtxt = folder / "configs" / f"{config_name}.pbtxt" if config_name else folder / "config.pbtxt"
    return {"parameters": parameters(pbtxt)}


def variant_repository(root: Path, model: str, changes: dict[str, str],
                       model_repository: Path = DEFAULT_MODEL_REPOSITORY) -> Path:
    """`root`/repository holding `model` with the engine parameters in `changes` set (each must exist in its
    config.pbtxt); its code is a link to the original, not a copy."""
    folder = Path(root) / "repository" / model
    folder.mkdir(parents=True)
    text = (Path(model_repository) / model / "config.pbtxt").read_text()
    for key, value in changes.items():
        text, n = re.subn(rf'(\{{\s*key:\s*"{re.escape(key)}",\s*value:\s*\{{\s*string_value:\s*")(?:[^"\\]|\\.)*(")',
                          lambda m: f"{m.group(1)}{json.dumps(value)[1:-1]}{m.group(2)}", text)  # escaped
        if n != 1:
            raise ValueError(f"{model}/config.pbtxt has no parameter {key!r}")
    (folder / "config.pbtxt").write_text(text)
    (folder / "1").symlink_to((Path(model_repository) / model / "1").resolve(), target_is_directory=True)
    return folder.parent
