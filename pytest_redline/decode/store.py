"""The outcome store: a crash-safe SQLite database of per-prompt outcomes.

- Content-keyed: :func:`content_key` hashes everything an outcome depends on, as
  :mod:`pytest_redline.keys` gathers it (engine, weights, arguments, config, suite, prompt,
  device, dtype, batch, decode format; inputs by content, never by path).
- Crash-safe: WAL journal, and one ``BEGIN IMMEDIATE ... COMMIT`` per outcome, so an
  outcome that finished is on disk even if the process is killed the next instant.
- Shared: xdist workers on one host write to it concurrently (busy timeout 30 s), and
  take *leases* on batches so that each batch is decoded by one process only.
- Checked on open: a file that is not ours, is corrupt, or has a newer schema version is
  a :class:`StoreError` naming the file; it is never silently trusted or overwritten. A file
  of schema 1 is migrated to 2 in one transaction (it gains the columns of the scoring: the
  answer, the rule, the finish reason and the scoring version, empty for old rows).
- Re-scorable: a row keeps the generated text and its finish reason, so when only the
  scoring changes its verdict is updated in place (:meth:`OutcomeStore.rescore`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sqlite3
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

SCHEMA_VERSION = 2
APPLICATION = "pytest-redline outcome store"
FILENAME = "outcomes.sqlite"
BUSY_TIMEOUT_S = 30.0
_SCHEMA = (
    "CREATE TABLE redline_schema (application TEXT NOT NULL, version INTEGER NOT NULL)",
    "CREATE TABLE outcomes (key TEXT PRIMARY KEY, grid TEXT, config TEXT, prompt TEXT, correct INTEGER NOT NULL,"
    " tokens REAL, forwards REAL, extra TEXT NOT NULL, text TEXT NOT NULL, session TEXT NOT NULL, created REAL NOT NULL,"
    " answer TEXT, rule TEXT NOT NULL DEFAULT '', finish_reason TEXT, scoring TEXT NOT NULL DEFAULT '')",
    "CREATE TABLE leases (key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,"
    " taken REAL NOT NULL)",
)
_MIGRATE_1 = tuple(f"ALTER TABLE outcomes ADD COLUMN {column}" for column in
                   ("answer TEXT", "rule TEXT NOT NULL DEFAULT ''", "finish_reason TEXT", "scoring TEXT NOT NULL DEFAULT ''"))
_COLUMNS = "correct, tokens, forwards, extra, text, session, answer, rule, finish_reason, scoring"


class StoreError(Exception):
    """The store cannot be used; the message names the file and what to do."""


@dataclass(frozen=True)
class StoredOutcome:
    """One prompt's outcome under one config. ``tokens``/``forwards`` are None when unknown.

    ``session`` identifies the session that decoded it (to tell reused from fresh outcomes).
    ``answer`` and ``rule`` are the final answer the scorer extracted and the rule that decided
    (:mod:`pytest_redline.suites.base`), ``finish_reason`` the generation's, and ``scoring``
    the scoring version that gave ``correct`` (``"engine"``: the engine set it).
    """

    correct: bool
    tokens: float | None
    forwards: float | None
    extra: Mapping[str, float] = field(default_factory=dict)
    text: str = ""
    session: str = ""
    answer: str | None = None
    rule: str = ""
    finish_reason: str | None = None
    scoring: str = ""


def content_key(parts: Mapping[str, Any]) -> str:
    """The SHA-256 of the canonical JSON of ``parts`` (keys sorted)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class OutcomeStore:
    """An open store file. Use :meth:`open` to get one inside a cache folder."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        try:
            self._con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise self._error(f"cannot open ({e})") from None
        try:
            self._check()
        except sqlite3.DatabaseError as e:
            self._con.close()
            raise self._error(f"not a usable outcome store ({e}); it may be corrupt") from None
        except StoreError:
            self._con.close()
            raise

    @classmethod
    def open(cls, folder: str | os.PathLike) -> "OutcomeStore":
        """Open (creating if needed) the store in ``folder``."""
        folder = Path(folder)
        _make_folder(folder)
        return cls(folder / FILENAME)

    def _error(self, message: str) -> StoreError:
        return StoreError(
            f"outcome store {self.path}: {message}. Remove the file, or pass --redline-cache-dir "
            "or --redline-no-cache."
        )

    # ------------------------------------------------------------------ schema

    def _check(self) -> None:
        self._con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        problems = [row[0] for row in self._con.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise self._error(f"corrupt ({'; '.join(problems[:3])})")
        if not self._tables():
            with self._immediate():
                if not self._tables():  # another worker may have created it meanwhile
                    for statement in _SCHEMA:
                        self._con.execute(statement)
                    self._con.execute("INSERT INTO redline_schema VALUES (?, ?)", (APPLICATION, SCHEMA_VERSION))
        tables = self._tables()
        if "redline_schema" not in tables:
            raise self._error(f"a foreign SQLite database (tables: {', '.join(sorted(tables))}), not ours")
        rows = self._con.execute("SELECT application, version FROM redline_schema").fetchall()
        if len(rows) != 1 or rows[0][0] != APPLICATION:
            raise self._error(f"a foreign or damaged schema table ({rows!r})")
        version = rows[0][1]
        if version == 1:
            version = self._migrate_1()
        if version != SCHEMA_VERSION:
            newer = "a newer" if version > SCHEMA_VERSION else "an older"
            raise self._error(f"written by {newer} pytest-redline (schema {version}, this one reads {SCHEMA_VERSION})")
        missing = {"outcomes", "leases"} - tables
        if missing:
            raise self._error(f"damaged: tables {', '.join(sorted(missing))} are missing")
        self._journal_wal()
        self._con.execute("PRAGMA synchronous = NORMAL")

    def _migrate_1(self) -> int:
        """Schema 1 -> 2 in one transaction (another process may have migrated meanwhile)."""
        with self._immediate():
            version = self._con.execute("SELECT version FROM redline_schema").fetchone()[0]
            if version == 1:
                for statement in _MIGRATE_1:
                    self._con.execute(statement)
                self._con.execute("UPDATE redline_schema SET version = 2")
                version = 2
        return version

    def _tables(self) -> set[str]:
        return {row[0] for row in self._con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _journal_wal(self) -> None:
        """The WAL journal (persistent in the file). Switching to it needs every other connection
        idle, and SQLite answers "database is locked" at once instead of waiting for them: when
        several processes open a new store together (xdist workers), retry until the busy
        timeout. A store already in WAL answers at once."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._con.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextmanager
    def _immediate(self) -> Iterator[None]:
        """One write transaction: takes the write lock up front (no deadlocking upgrade)."""
        self._con.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    # ------------------------------------------------------------------ outcomes

    def get(self, keys: Iterable[str]) -> dict[str, StoredOutcome]:
        """The stored outcomes among ``keys``."""
        keys = list(keys)
        found: dict[str, StoredOutcome] = {}
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            rows = self._con.execute(
                f"SELECT key, {_COLUMNS} FROM outcomes WHERE key IN ({','.join('?' * len(part))})", part)
            for key, correct, tokens, forwards, extra, text, session, answer, rule, finish, scoring in rows:
                found[key] = StoredOutcome(bool(correct), tokens, forwards, json.loads(extra), text, session,
                                           answer, rule, finish, scoring)
        return found

    def put(self, key: str, outcome: StoredOutcome, *, grid: str = "", config: str = "", prompt: str = "") -> None:
        """Commit one outcome (the labels only help a human reading the file)."""
        with self._immediate():
            self._con.execute(
                f"INSERT OR IGNORE INTO outcomes (key, grid, config, prompt, created, {_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, grid, config, prompt, time.time(), int(outcome.correct), outcome.tokens, outcome.forwards,
                 json.dumps(dict(outcome.extra), sort_keys=True), outcome.text, outcome.session,
                 outcome.answer, outcome.rule, outcome.finish_reason, outcome.scoring),
            )

    def rescore(self, key: str, outcome: StoredOutcome) -> None:
        """Replace the verdict of a stored outcome (its text, costs and session stay)."""
        with self._immediate():
            self._con.execute("UPDATE outcomes SET correct = ?, answer = ?, rule = ?, scoring = ? WHERE key = ?",
                              (int(outcome.correct), outcome.answer, outcome.rule, outcome.scoring, key))

    def count(self) -> int:
        return self._con.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0]

    # ------------------------------------------------------------------ leases

    def take_lease(self, key: str) -> bool:
        """Take the lease on ``key`` unless a live process on this host holds it."""
        host, pid = socket.gethostname(), os.getpid()
        with self._immediate():
            row = self._con.execute("SELECT owner, host, pid FROM leases WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] != self.owner and not (row[1] == host and not _alive(row[2])):
                return False
            self._con.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?)", (key, self.owner, host, pid, time.time()))
        return True

    def release(self, key: str) -> None:
        with self._immediate():
            self._con.execute("DELETE FROM leases WHERE key = ? AND owner = ?", (key, self.owner))

    def close(self) -> None:
        self._con.close()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _make_folder(folder: Path) -> None:
    """Create the cache folder atomically, with a .gitignore (losing a race is fine)."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-tmp-", dir=folder.parent))
    (tmp / ".gitignore").write_text("# created by pytest-redline\n*\n")
    try:
        tmp.rename(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    if not folder.is_dir():
        raise StoreError(f"outcome store folder {folder}: cannot be created")
