"""Content-addressed cache of raw judge replies, so re-runs cost nothing and interrupted runs resume.

The key is the SHA-256 of the judge model, the template version, the prompt, the two responses in the
order shown and the order label: any change to what the judge would see gives a new key, and nothing
else (file names, model names, row order) matters. Only raw replies are stored; parsing happens after,
so a parser change never needs new requests. Failed requests are not stored, so a re-run retries them.

On disk the cache is one append-only JSONL file ``<cache_dir>/replies.jsonl``, one
``{"key", "reply", "usage", ...}`` object per line, written and flushed as each reply arrives. A line
torn by an interruption is ignored on load; appends from several processes are safe because each record
is one ``write`` of one line to a file opened with ``O_APPEND``. The first record for a key wins, except
that a record written with ``replace=True`` (a reply asked again with ``--retry_unparseable``) takes
the place of the ones before it.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> k = cache_key("gpt-4o-2024-05-13", "summarize-v1", "post", "s1", "s2", "ab")
>>> len(k)
64
>>> c = JudgeCache(d)
>>> c.put(k, {"reply": "Verdict: [[A]]"})
>>> JudgeCache(d).get(k)["reply"]
'Verdict: [[A]]'
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

CACHE_FILE = "replies.jsonl"


def cache_key(
    judge_model: str, template_version: str, prompt: str, first: str, second: str, order: str
) -> str:
    """SHA-256 hex digest of everything that determines the judge's reply (see module doc)."""
    payload = json.dumps(
        [judge_model, template_version, prompt, first, second, order], ensure_ascii=False
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class JudgeCache:
    """Append-only JSONL reply cache in ``cache_dir`` (created if missing)."""

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(cache_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / CACHE_FILE
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        self.torn_lines = 0
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    key = rec["key"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.torn_lines += 1  # an interrupted write: the request is simply redone
                    continue
                if rec.get("replaces") or key not in self._entries:
                    self._entries[key] = rec

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored record for ``key`` or None."""
        return self._entries.get(key)

    def put(self, key: str, record: dict[str, Any], *, replace: bool = False) -> None:
        """Store ``record`` under ``key`` and flush to disk: a no-op if the key is already present,
        unless ``replace`` (then the new record supersedes the old one, now and on every load)."""
        with self._lock:
            if key in self._entries and not replace:
                return
            rec = {"key": key, **record, **({"replaces": True} if replace else {})}
            line = json.dumps(rec, ensure_ascii=False) + "\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                # A previous run killed mid-write may have left a line without its newline: start a
                # fresh line so this record is not glued onto the torn one.
                if os.fstat(fd).st_size > 0:
                    with open(self.path, "rb") as fh:
                        fh.seek(-1, os.SEEK_END)
                        if fh.read(1) != b"\n":
                            line = "\n" + line
                os.write(fd, line.encode("utf-8"))
            finally:
                os.close(fd)
            self._entries[key] = rec
