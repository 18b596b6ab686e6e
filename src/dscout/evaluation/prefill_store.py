"""A bounded prefill store: the target's prompt prefills kept on host memory, within a byte cap.

A benchmark job decodes the same prompts with AR and every method (and Table 4 serves the same batches to every
method), so the target's prefill of a prompt (KV cache, last-position logits, tapped hidden states) is computed
once and copied for the later methods (:meth:`dscout.decoding.engine.SpeculativeEngine.generate`,
:meth:`dscout.decoding.batched.BatchedEngine.generate`). A plain dict kept every deep-copied cache on the GPU,
per distinct prompt, across methods and repeats (issue 47): on Qwen3-8B a 2,048-token prompt's cache is about
300 MB. This store

* keeps its entries on the host (the KV cache moved with transformers' own ``CacheLayerMixin.offload``, the
  other tensors with ``.to("cpu")``) and hands back a fresh copy on each cache layer's own device (one host to
  device copy per tensor);
* holds at most ``max_bytes`` (config ``benchmarks.prefill_store_gb``): the least recently used entries leave
  first, and an entry larger than the cap is not kept;
* is meant for first turns only (the callers pass it for turn 0: an MT-Bench turn 2 carries the method's own
  turn-1 answer, a context no other method or repeat shares).

Decoding is unaffected (the same tensors, copied); only ``prefill_reused`` / ``prefill_seconds`` of a record say
whether a prefill came from the store.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch


def _cache_layers(cache) -> list:
    return list(getattr(cache, "layers", []) or [])


def entry_bytes(entry: dict) -> int:
    """Bytes a stored prefill holds: its cache's keys and values, logits and taps (any device).

    Args:
        entry: ``{"cache": transformers Cache, "logits": tensor, "taps": tensor or None, "seconds": float}``.
    Returns:
        the byte count (``numel * element_size`` summed).
    """
    total = 0
    for layer in _cache_layers(entry.get("cache")):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    for name in ("logits", "taps"):
        t = entry.get(name)
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


def _sync(device) -> None:
    """Wait for the non-blocking copies to the host (a no-op off CUDA, and for fake CUDA tensors on a CPU)."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)


class PrefillStore:
    """A byte-capped, least-recently-used store of prompt prefills on host memory (a drop-in for the ``dict`` the
    engines accept as ``prefill_store``: ``get(key)``, ``store[key] = entry``, ``key in store``, ``len``).

    Args:
        max_bytes: the cap on the bytes held (0 = keep nothing: every prefill is computed).
    Raises:
        ValueError: if ``max_bytes`` is negative.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"prefill store cap must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.evicted = 0
        self.refused = 0
        self._entries: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __setitem__(self, key, entry: dict) -> None:
        """Keep ``entry`` (its tensors moved to host memory), evicting the least recently used entries until it
        fits; an entry larger than the cap is not kept (counted in ``refused``)."""
        size = entry_bytes(entry)
        if key in self._entries:
            self.bytes -= self._entries.pop(key)[1]
        if size > self.max_bytes:
            self.refused += 1
            return
        while self.bytes + size > self.max_bytes and self._entries:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
            self.evicted += 1
        device = entry["logits"].device if isinstance(entry.get("logits"), torch.Tensor) else torch.device("cpu")
        host = dict(entry)
        cache = entry.get("cache")
        if cache is not None:
            for layer in _cache_layers(cache):  # the engine passes its own copy: moved, not copied again
                layer.offload()
        host["logits"] = entry["logits"].to("cpu") if isinstance(entry.get("logits"), torch.Tensor) else None
        host["taps"] = entry["taps"].to("cpu") if isinstance(entry.get("taps"), torch.Tensor) else None
        host["device"] = device
        _sync(device)  # offload's copies are non-blocking
        self._entries[key] = (host, size)
        self.bytes += size

    def get(self, key, default=None):
        """A fresh copy of the stored prefill on the device it was computed on, or ``default``."""
        item = self._entries.get(key)
        if item is None:
            return default
        self._entries.move_to_end(key)
        host = item[0]
        device = host["device"]
        cache = host.get("cache")
        if cache is not None:  # the cache's structure deep-copied, its tensors copied once, straight to the device
            memo = {id(t): t.to(getattr(layer, "device", None) or device, copy=True)
                    for layer in _cache_layers(cache)
                    for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                    if isinstance(t, torch.Tensor)}
            cache = copy.deepcopy(cache, memo)
        out = dict(host)
        out["cache"] = cache
        out["logits"] = host["logits"].to(device) if host["logits"] is not None else None
        out["taps"] = host["taps"].to(device) if host["taps"] is not None else None
        return out
