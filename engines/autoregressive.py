"""Batched autoregressive decoding over a KV cache that is rolled back per request.

The speculative and the quantized engines decode a chunk of prompts as one batch. Requests in a
batch hold different numbers of tokens, and after a speculative round each keeps a different
number of the tokens it fed, so the batch is stored as left-padded rows that may contain holes:

- :class:`RowCache` is one model's cache over the rows. ``forward`` feeds each row its own tokens
  (left-padded to a common width; padding slots are invalid keys) and returns the last logits.
  ``retain`` rolls the cache back: each row keeps the longest prefix of its cached tokens that
  agrees with the row's accepted sequence, every other column is dropped (a rejected token's
  K/V never stays), and finished rows leave the batch. The K/V sit in one preallocated buffer
  per model (:class:`KVStore`; each :class:`RowLayer` views its slot): a rollback moves a row's
  write cursor back instead of copying the cache, and a finished row's slot is refilled by the
  last live row (:func:`fill_order`) in one copy for all layers, so the engine's own work per
  round stays small beside the model's. Rows fed equally many tokens can be fed as one tensor
  (no padding, nothing listed per forward). With ``recompute=True`` nothing
  is cached: every forward recomputes the row from its first token (the reference for tests).
- Attention uses an explicit 4-D additive mask: a query attends the valid keys at positions up to
  its own (``modeling.block_mask`` over positions: causal). Position ids count from 0 at each
  row's first token, as in training (no BOS).
- :func:`greedy` is plain greedy decoding on a :class:`RowCache`; :class:`ARRequest` keeps one
  prompt's tokens and stops at the first EOS, at the first of the prompt's stop strings
  (``Prompt.stop``: the text before it is returned, the tokens through it counted) or at
  ``max_new_tokens``.
"""
from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from pytest_redline.contracts import Generation, Prompt, cut_at_stop, moved
from pytest_redline.engines import common

__getattr__ = moved(__name__, ("encode", "eos_ids", "set_threads"), "pytest_redline.engines.common")


@dataclass
class ARRequest:
    """One prompt's tokens; ``output`` is what follows the prompt, cut after the first EOS.

    With ``stop`` strings (``Prompt.stop``) and ``decode`` (ids -> text), the request also ends
    at the token that completes the first stop string: ``output`` keeps the tokens through it
    and ``text`` the text before the stop string. ``finish_reason``: ``eos``, ``stop`` or
    ``length`` once done.
    """

    tokens: list[int]
    prompt_len: int
    limit: int  # prompt_len + max_new_tokens
    eos: frozenset[int]
    done: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None
    finish_reason: str | None = None

    def append(self, new: Sequence[int]) -> int:
        """Append tokens up to the first EOS, stop string or the length limit; returns how many were appended."""
        new = new[: self.limit - len(self.tokens)]
        if not self.stop and self.eos.isdisjoint(new):  # the usual case, in one step
            self.tokens.extend(map(int, new))
            if len(self.tokens) >= self.limit:
                self.done, self.finish_reason = True, "length"
            return len(new)
        taken = 0
        for token in new:
            self.tokens.append(int(token))
            taken += 1
            if token in self.eos:
                self.done, self.finish_reason = True, "eos"
                break
            if self.stop and cut_at_stop(self._decoded(), self.stop)[1]:
                self.done, self.finish_reason = True, "stop"
                break
        if not self.done and len(self.tokens) >= self.limit:
            self.done, self.finish_reason = True, "length"
        return taken

    def count(self, key: str, value: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + value

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def text(self) -> str:
        """The output's text without EOS, cut before the first stop string."""
        return cut_at_stop(self._decoded(), self.stop)[0]

    def _decoded(self) -> str:
        if self.decode is None:
            raise ValueError("ARRequest.decode is needed for text and stop strings")
        return self.decode([t for t in self.output if t not in self.eos])


def new_request(tokenizer, prompt: Prompt, max_new_tokens: int, eos: frozenset[int], engine: str,
                plain_ids: Sequence[int] | None = None) -> ARRequest:
    """The request for ``prompt``: its encoded ids (see :func:`common.encode`), the token limit, and its stop strings."""
    ids = common.encode(tokenizer, prompt, engine, plain_ids)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    return ARRequest(tokens=ids, prompt_len=len(ids), limit=len(ids) + max_new_tokens, eos=eos, stop=tuple(prompt.stop), decode=decode)


def new_requests(tokenizer, prompts: Sequence[Prompt], max_new_tokens: int, eos: frozenset[int], engine: str) -> list[ARRequest]:
    """:func:`new_request` for every prompt; the prompts tokenized as plain text are tokenized in
    one batch call (the same ids, for a fraction of the per-call cost)."""
    templated = bool(getattr(tokenizer, "chat_template", None))
    plain = [i for i, p in enumerate(prompts) if not (templated and p.messages)]
    ids = dict(zip(plain, tokenizer([prompts[i].text for i in plain]).input_ids)) if plain else {}
    return [new_request(tokenizer, p, max_new_tokens, eos, engine, ids.get(i)) for i, p in enumerate(prompts)]


def generation(req: ARRequest, extra: Mapping[str, float]) -> Generation:
    """The request's Generation: text before any stop string, tokens and forwards through the cut."""
    return Generation(text=req.text, tokens=len(req.output), forwards=req.counts.get("forwards", 0), extra=dict(extra),
                      finish_reason=req.finish_reason)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``. Rows that differ do so in their
    last few tokens (a rollback drops at most a round's), so the search gallops back from the
    end: list slices compare at C speed, and the last stretch is scanned."""
    a, b = (a, b) if len(a) <= len(b) else (b, a)
    n = len(a)
    if a == b[:n]:  # a cache's tokens are usually all kept: one copy to tell
        return n
    back = 1
    while (low := n - back) > 0 and a[:low] != b[:low]:
        back *= 2
    low = max(low, 0)  # a[:low] == b[:low]
    while low < n and a[low] == b[low]:
        low += 1
    return low


class RowLayer(CacheLayerMixin):
    """One layer's K/V over the rows: views ``(rows, capacity, heads, head_dim)`` of its slot in a
    :class:`KVStore`.

    The owning :class:`RowCache` plans each forward (``rows``/``columns``: where each live row
    writes its new K/V; ``width``: how many columns attention reads). Writing copies the new
    columns only, and attention reads a view of the buffer: nothing else is copied per forward.
    """

    is_sliding = False

    def __init__(self, owner: "RowCache", index: int):
        super().__init__()
        self.owner, self.index = owner, index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.owner.store_for(self, key_states).attach(self)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self.owner
        self.store.reserve(owner.width, owner.capacity)
        self.keys[owner.rows, owner.columns] = key_states.transpose(1, 2)
        self.values[owner.rows, owner.columns] = value_states.transpose(1, 2)
        n, width = key_states.shape[0], owner.width
        return self.keys[:n, :width].transpose(1, 2), self.values[:n, :width].transpose(1, 2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return self.owner.width

    def get_max_length(self) -> int:
        return -1


class KVStore:
    """The K/V of several layers of one shape in one preallocated buffer ``(rows, layers, 2,
    capacity, heads, head_dim)``: moving a row (:meth:`move_rows`) is one copy for all of them.

    Columns start uninitialised and are zeroed when attention first reads them (:meth:`reserve`),
    so an invalid key is never garbage (a NaN would survive the mask) and unused columns cost nothing.
    """

    def __init__(self, rows: int, layers: int, capacity: int, like: torch.Tensor):
        _, heads, _, dim = like.shape
        self.kv = torch.empty(rows, layers, 2, capacity, heads, dim, dtype=like.dtype, device=like.device)
        self.zeroed = 0
        self.layers: list[RowLayer] = []

    def attach(self, layer: RowLayer) -> None:
        """Give ``layer`` the views of its slot (its place in ``layers``)."""
        layer.store, layer.slot = self, len(self.layers)
        self.layers.append(layer)
        self._view(layer)

    def _view(self, layer: RowLayer) -> None:
        layer.keys, layer.values = self.kv[:, layer.slot, 0], self.kv[:, layer.slot, 1]

    def reserve(self, width: int, capacity: int) -> None:
        """Grow to ``capacity`` columns (a copy; amortised by doubling; rare: the engines size the
        buffer for the requests' token limits), and zero the columns up to ``width``."""
        if self.kv.shape[3] < capacity:
            grown = self.kv.new_zeros(*self.kv.shape[:3], capacity, *self.kv.shape[4:])
            grown[:, :, :, : self.kv.shape[3]] = self.kv
            self.kv = grown
            for layer in self.layers:
                self._view(layer)
        if width > self.zeroed:
            self.kv[:, :, :, self.zeroed : width] = 0
            self.zeroed = width

    def move_rows(self, moves: Sequence[tuple[int, int]], width: int) -> None:
        """Copy row ``src`` into slot ``dst`` for each ``(dst, src)`` of ``moves``: their first
        ``width`` columns, every layer at once. One copy per row reads and writes each byte once
        (an indexed gather and scatter copy twice, and cost 3-5x more here)."""
        kv = self.kv[:, :, :, :width]
        for dst, src in moves:
            kv[dst].copy_(kv[src])


def fill_order(rows: int, keep: Sequence[int]) -> list[int]:
    """The order in which the rows ``keep`` (of ``rows``) stay in a :class:`RowCache`.

    Kept rows keep their slots, except that each slot left by a dropped row among the first
    ``len(keep)`` is filled by the last kept row beyond them: only the moved rows are copied,
    and the live rows stay a prefix of the buffer. Returns, per new slot, the old row.
    """
    n = len(keep)
    kept = set(keep)
    tail = [r for r in keep if r >= n]
    return [r if r in kept else tail.pop() for r in range(n)]


class RowCache:
    """One model's KV cache over a batch of left-padded rows, rolled back per row.

    The K/V live in preallocated buffers (:class:`KVStore`: one for all the layers of one shape).
    Each row has its own column cursor: a forward writes a row's new tokens at its cursor (its left
    padding goes to a scratch column that is never read, so a row's columns have no holes); a
    rollback only moves the cursor back, so later tokens overwrite the dropped columns. Finished
    rows leave by :func:`fill_order`. A row's valid keys are therefore exactly its columns before
    its cursor, and a key's position is its column (``positions``): the masks follow from the
    cursors alone. A row's cursor is the number of its cached tokens.
    """

    def __init__(self, model, rows: int, pad_id: int, recompute: bool = False, capacity: int = 64):
        self.model, self.pad_id, self.recompute = model, pad_id, recompute
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.get_input_embeddings().weight.dtype  # embeddings are never quantized
        # the decoder and the head are called directly (as LlamaForCausalLM.forward does, without
        # its per-call wrappers), unless the architecture post-processes its logits
        self._direct = not any(getattr(model.config, key, None) for key in ("final_logit_softcapping", "logit_scale"))
        self._decoder, self._head = model.get_decoder(), model.get_output_embeddings()  # looked up once, not per forward
        forward_args = inspect.signature((self._decoder if self._direct else model).forward).parameters
        self._open, self._shut = (torch.tensor(v, dtype=self.dtype, device=self.device) for v in (0.0, torch.finfo(self.dtype).min))
        self._cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"  # transformers 5.x vs older
        self._tokens: list[list[int]] = [[] for _ in range(rows)]
        self.capacity_rows, self.capacity = rows, capacity
        self._reset()

    def _reset(self) -> None:
        rows = len(self._tokens)
        self.cache = Cache(layers=[RowLayer(self, i) for i in range(self.model.config.get_text_config().num_hidden_layers)])
        self.stores: list[KVStore] = []
        self._fed: list[torch.Tensor] = []  # tensor feeds not yet listed in ``_tokens``
        self._cursor_t: torch.Tensor | None = None  # the cursors as a (rows, 1) tensor, while known without a copy
        self._run: tuple[torch.Tensor, int, int] | None = None  # see _one_token_mask
        self.end = 0  # the largest cursor
        self._columns(self.capacity)
        self.slots = torch.arange(rows, device=self.device)
        self._slots_by_shape: dict[tuple[int, int], torch.Tensor] = {}  # (rows, width) -> each query's slot
        self.width = 0

    def _columns(self, count: int) -> None:
        """``positions``: the column indices (a valid key's position is its column), at least ``count``."""
        self.positions = torch.arange(count, device=self.device)
        self._positions4 = self.positions.view(1, 1, 1, -1)  # over the keys of a 4-D mask

    def store_for(self, layer: RowLayer, key_states: torch.Tensor) -> KVStore:
        """The store that holds ``layer``: the first layer's, sized for every layer and shared by
        those of its shape (all, in the usual models); a layer of another shape gets its own."""
        first = self.stores[0] if self.stores else None
        if first is not None and first.kv.shape[-2:] == (key_states.shape[1], key_states.shape[3]) and first.kv.dtype == key_states.dtype:
            return first
        self.stores.append(KVStore(self.capacity_rows, len(self.cache.layers) if first is None else 1, self.capacity, key_states))
        return self.stores[-1]

    @property
    def tokens(self) -> list[list[int]]:
        """Per row, the tokens whose K/V are cached."""
        if self._fed:  # tensor feeds are listed once, when asked for
            for listed, new in zip(self._tokens, (torch.cat(self._fed, 1) if len(self._fed) > 1 else self._fed[0]).tolist()):
                listed.extend(new)
            self._fed = []
        return self._tokens

    def cached(self, row: int) -> int:
        return len(self.tokens[row])

    def forward(self, feeds: Sequence[Sequence[int]] | torch.Tensor, keep: int) -> torch.Tensor:
        """Feed row ``r`` the tokens ``feeds[r]`` (at least ``keep`` each); their last ``keep`` logits.

        ``feeds`` may also be a ``(rows, width)`` tensor of ids, when every row is fed ``width``
        tokens: then nothing is padded or listed (the draft's one-token steps, the target's rounds).
        """
        if torch.is_grad_enabled():  # the layers' K/V are views of one buffer, which autograd could not write in place
            with torch.no_grad():
                return self.forward(feeds, keep)
        if self.recompute:
            feeds = [self.tokens[r] + list(f) for r, f in enumerate(feeds.tolist() if isinstance(feeds, torch.Tensor) else feeds)]
            self._tokens = [[] for _ in feeds]
            self._reset()
        cursor = self._cursor_t
        if isinstance(feeds, torch.Tensor):
            (n, width), fewest, end = feeds.shape, feeds.shape[1], self.end + feeds.shape[1]
            if cursor is None:
                cursor = torch.tensor([len(t) for t in self.tokens], dtype=torch.long, device=self.device)[:, None]
        else:
            sizes, starts = [len(f) for f in feeds], [len(t) for t in self.tokens]
            n, width, fewest = len(feeds), max(sizes), min(sizes)
            end = max(map(operator.add, starts, sizes))
            if cursor is None or width > 1:  # the cursors and the feeds' lengths in one copy
                both = torch.tensor([starts, sizes], dtype=torch.long, device=self.device)[:, :, None]
                cursor, advance = both.unbind(0) if cursor is None else (cursor, both[1])
        if fewest < keep:
            raise ValueError(f"{fewest} tokens fed to a row, {keep} logits asked for")
        if end >= self.capacity:  # the last column is the scratch column
            self.capacity = max(end + 1, 2 * self.capacity)  # the stores grow at their next update
            self._columns(max(self.capacity, self.positions.numel()))
        # a row's columns have no holes, so its next column is also its next position (its cached
        # tokens): the plan is one tensor expression over the rows, not a Python loop
        if isinstance(feeds, torch.Tensor):
            ids, q_pos, advance = feeds, cursor + self.positions[None, :width] if width > 1 else cursor, width
            self.columns = q_pos
            self._fed.append(feeds)
        else:  # left-padded to the widest feed
            ids = torch.tensor([f if len(f) == width else [self.pad_id] * (width - len(f)) + list(f) for f in feeds],
                               dtype=torch.long, device=self.device)
            if width == 1:
                q_pos, advance = cursor, 1
                self.columns = cursor
            else:  # offset of each slot in its row's feed; negative: left padding, written to the scratch column
                offset = self.positions[None, :width] - (width - advance)
                q_valid = offset >= 0
                q_pos = torch.where(q_valid, cursor + offset, 0)
                self.columns = torch.where(q_valid, q_pos, self.capacity - 1)
            for t, f in zip(self.tokens, feeds):
                t.extend(f)
        self.rows = self._slots_by_shape.get((n, width))
        if self.rows is None:
            self.rows = self._slots_by_shape[n, width] = self.slots[:n, None].expand(n, width)
        self.width = self.end = end
        # 0 or the dtype's min, as modeling.block_mask gives over these keys: a row's valid keys
        # are its columns before its new cursor, and a key's position is its column
        if width == 1:  # one token per row: it attends every key the row holds (itself included)
            mask = self._one_token_mask(cursor, end)
        else:  # causal: a query attends the columns up to its position (all held); a padding query
            # (position 0) attends column 0, which every row holds
            self._run = None
            mask = torch.where(self._positions4[..., :end] <= q_pos[:, None, :, None], self._open, self._shut)
        inputs = dict(input_ids=ids, attention_mask=mask, position_ids=q_pos, use_cache=True, **{self._cache_kwarg: self.cache})
        if self._direct:
            hidden = self._decoder(**inputs).last_hidden_state
            logits = self._head(hidden if keep == width else hidden[:, -keep:])
        else:
            logits = self.model(**inputs, logits_to_keep=keep).logits[:, -keep:]
        self._cursor_t = cursor + advance  # the next forward needs no list-to-tensor copy
        return logits

    RUN = 8  # how many one-token forwards after the first read views of its mask

    def _one_token_mask(self, cursor: torch.Tensor, end: int) -> torch.Tensor:
        """The mask of a one-token forward: row r attends columns ``<= cursor[r]`` of ``end``.

        Successive one-token forwards (every row one column further each time, no rollback
        between: a draft's steps) read views of one tensor built at the first of a run: at step
        s of the run, ``mask[c] = (c <= C + s) = B[c + RUN - s]`` with ``B[k] = (k <= C + RUN)``,
        C the cursors at the run's first step. Same values as one ``where`` per forward, one op
        instead of four.
        """
        if self._run is not None:
            built, first_end, step = self._run
            step += 1
            if step <= self.RUN and end == first_end + step and built.shape[0] == cursor.shape[0]:
                self._run = built, first_end, step
                return built[..., self.RUN - step : self.RUN + first_end]
        if self.positions.numel() < end + self.RUN:
            self._columns(end + self.RUN)
        built = torch.where(self._positions4[..., : end + self.RUN] <= (cursor + self.RUN).view(-1, 1, 1, 1), self._open, self._shut)
        self._run = built, end, 0
        return built[..., self.RUN : self.RUN + end]

    def retain(self, sequences: Sequence[Sequence[int]], rows: Sequence[int]) -> None:
        """Keep rows ``rows`` (new slot j holds old row ``rows[j]``); each keeps its cached tokens
        that prefix ``sequences[row]``, all but the last at most (the next forward feeds that one:
        its logits are the ones the engine needs)."""
        tokens = self.tokens
        counts = [min(common_prefix(tokens[r], sequences[r]), len(sequences[r]) - 1) for r in rows]
        if len(rows) == len(tokens) and all(j == r and len(tokens[r]) == c for j, (r, c) in enumerate(zip(rows, counts))):
            return  # every row stays in its slot and keeps every cached token (greedy, while none ends): the cursors stand
        self._tokens = [tokens[r] for r in rows]
        for t, c in zip(self._tokens, counts):
            del t[c:]  # each row keeps its first ``count`` tokens; its cursor moves back to just after them
        self._cursor_t = self._run = None
        self.end = max(counts, default=0)
        if self.recompute:
            return
        moved = [(j, r) for j, r in enumerate(rows) if j != r]
        if moved:
            width = max(counts[j] for j, _ in moved)
            for store in self.stores:
                store.move_rows(moved, width)


def token_count(tokenizer, *models) -> int:
    """How many ids are tokens: the tokenizer's, within every model's vocabulary. A checkpoint's
    embedding is often padded beyond its tokenizer (Qwen2.5-7B: 152,064 rows, 0.5B: 151,936, for
    151,665 tokens); an id in the padding is no token, and a smaller model has no row for it."""
    return min([len(tokenizer)] + [m.get_output_embeddings().weight.shape[0] for m in models])


def only_tokens(logits: torch.Tensor, tokens: int) -> torch.Tensor:
    """``logits`` with the ids from ``tokens`` on (embedding padding) at -inf, in place (the
    engines pass the head's own output, which nothing else reads): never picked, no probability."""
    if logits.shape[-1] > tokens:
        logits[..., tokens:] = -torch.inf
    return logits


@torch.no_grad()
def greedy(model, requests: Sequence[ARRequest], pad_id: int, recompute: bool = False, row_cache=None, tokens: int | None = None) -> None:
    """Greedy decoding of ``requests`` as one batch, in place; counts ``forwards`` per request.

    The first forward is the prefill (it yields the first token); each later one feeds the last
    token. Finished requests leave the batch. ``row_cache``: the cache class (default
    :class:`RowCache`; tests pass the one it replaced). ``tokens``: ids from it on are embedding
    padding, never picked (:func:`only_tokens`).
    """
    running = [r for r in requests if not r.done]
    row_cache = row_cache or RowCache
    cache = row_cache(model, len(running), pad_id, recompute, capacity=max((r.limit for r in running), default=1))
    while running:
        logits = cache.forward([r.tokens[len(held) :] for r, held in zip(running, cache.tokens)], keep=1)[:, -1]
        if tokens is not None:
            logits = only_tokens(logits, tokens)
        for req, token in zip(running, logits.argmax(-1).tolist()):
            req.append([token])
            req.count("forwards")
        order = fill_order(len(running), [i for i, r in enumerate(running) if not r.done])
        cache.retain([r.tokens for r in running], order)
        running = [running[i] for i in order]
