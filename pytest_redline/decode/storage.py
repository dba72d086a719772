"""The store's side of decoding: the keys of a batch, the legacy lookup, leases and rescoring."""
from __future__ import annotations

from typing import Iterable, Mapping

from pytest_redline.contracts import Prompt
from pytest_redline.decode.items import Batch
from pytest_redline.decode.store import StoredOutcome, content_key
from pytest_redline.scoring import rescored


class Storage:
    """The outcome store's side of decoding: keys, the legacy chain, leases, rescoring (part of
    :class:`~pytest_redline.decode.decoder.Decoder`)."""

    def _keys(self, config: str, batch: Batch) -> list[str]:
        """The outcome keys of a batch (:mod:`pytest_redline.keys`): what decoding depends on,
        stop strings included, and not the scoring version."""
        return self.keys.current(config, [self.cal.prompts[i] for i in batch.prompts])

    def _warn_shared_keys(self, config: str, keys: Iterable[str]) -> None:
        """Two configs whose outcomes have the same key share them: say so once per pair (two
        endpoints under one label, or a server flag changed without a new server_revision)."""
        for key in keys:
            owner = self._key_owner.setdefault(key, config)
            if owner != config and (owner, config) not in self._shared:
                self._shared.add((owner, config))
                self.progress(
                    f"redline {self.cal.grid.name}: warning: configs {owner!r} and {config!r} resolve to the same "
                    "outcome key, so they share outcomes; if they are different deployments, give each its own "
                    "engine_args (an endpoint's label or server_revision)"
                )

    def _load(self, config: str, batch: Batch, keys: list[str]) -> bool:
        """Take what the store has of this batch; True when it has all of it."""
        found = self.store.get(keys)
        if len(found) < len(keys):
            found.update(self._legacy(config, batch, keys, found))
        for i, key in zip(batch.prompts, keys):
            if key in found:
                self._outcomes[config][i] = self._current(key, self.cal.prompts[i], found[key])
        return len(found) == len(keys)

    def _legacy(self, config: str, batch: Batch, keys: list[str], found: Mapping[str, StoredOutcome]) -> dict[str, StoredOutcome]:
        """Outcomes stored under an older key format (the legacy chain, each format in order),
        copied to their current keys."""
        copied: dict[str, StoredOutcome] = {}
        for older in self.keys.older(config, [self.cal.prompts[i] for i in batch.prompts]):
            wanted = {old: key for key, old in zip(keys, older) if old is not None and key not in found and key not in copied}
            if not wanted:
                break
            for old_key, outcome in self.store.get(wanted).items():
                self.store.put(wanted[old_key], outcome, grid=self.cal.grid.name, config=config)
                copied[wanted[old_key]] = outcome
        return copied

    def _current(self, key: str, prompt: Prompt, outcome: StoredOutcome) -> StoredOutcome:
        """A stored outcome under the current scoring: judged again (and updated in the store)
        when the scoring version changed; nothing is decoded."""
        again = rescored(self.cal, prompt, outcome, self.scoring)
        if again is None:
            return outcome
        self.store.rescore(key, again)
        self.rescored += 1
        return again

    def _run_leased(self, config: str, batch: Batch, keys: list[str]) -> bool:
        """Decode the batch under its lease; False when another live process holds it."""
        lease = "batch:" + content_key({"keys": keys})
        if not self.store.take_lease(lease):
            return False
        try:
            if not self._load(config, batch, keys):  # finished by another process meanwhile?
                self._decode(config, batch, keys)
        finally:
            self.store.release(lease)
        return True
