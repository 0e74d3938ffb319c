"""The raw per-request JSONL file (one `RequestRecord` per line) and the run's metadata (run.json)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Iterable, Iterator

from loadtest.metrics import RequestRecord

REQUESTS_FILE = "requests.jsonl"
RUN_FILE = "run.json"


class JsonlWriter:
    """Appends dicts as JSON lines; flushed every line so a killed run keeps what it measured."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, obj: dict) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._f.closed:
                self._f.write(line)
                self._f.flush()

    def write_many(self, objs: Iterable[dict]) -> None:
        for o in objs:
            self.write(o)

    def close(self) -> None:
        with self._lock:
            self._f.close()


def iter_records(path: str | Path) -> Iterator[RequestRecord]:
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield RequestRecord.from_dict(json.loads(line))
                except (json.JSONDecodeError, TypeError) as e:
                    raise ValueError(f"{path}:{n}: not a request record: {e}") from e


def read_records(path: str | Path) -> list[RequestRecord]:
    return list(iter_records(path))


def write_run_meta(out_dir: str | Path, meta: dict) -> None:
    p = Path(out_dir) / RUN_FILE
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")


def read_run_meta(out_dir: str | Path) -> dict:
    p = Path(out_dir) / RUN_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}
