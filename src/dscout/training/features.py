"""Target-feature cache: the frozen target's taps written once per (target, data, layer set), read many times.

On a CPU the target forward dominates a training step; every recipe of an experiment trains on the same
sequences with the same taps, so they share one cache (SpecForge's offline mode, PR #445). AWL also needs
the target's distribution at every position: the cache keeps the final-normed hidden state and the
log-sum-exp of the logits, from which ``log P(y) = <h, W[y]> - lse`` for any ``y`` (see
:func:`dscout.training.losses.target_logprob_from_cache`).

Layout: ``index.json`` plus shards ``shard_XXXXX.safetensors``, each holding the concatenation of its
sequences (``input_ids`` int32 ``[T]``, ``loss_mask`` uint8 ``[T]``, ``taps`` ``[T, t * D]``,
``final_hidden`` ``[T, D]``, ``lse`` float32 ``[T]``) and ``offsets`` ``[n + 1]``. A shard is written to a
temporary name and renamed, so a killed run resumes at the first missing shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from .step import FeatureBatch

STORE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _pad(seqs: list[torch.Tensor], value=0) -> torch.Tensor:
    n = max(s.shape[0] for s in seqs)
    out = seqs[0].new_full((len(seqs), n, *seqs[0].shape[1:]), value)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
    return out


def _digest(chunk: list[dict], layer_ids: list[int]) -> str:
    h = hashlib.sha256(json.dumps(list(layer_ids)).encode())
    for s in chunk:
        h.update(json.dumps([s["input_ids"], s["loss_mask"]]).encode())
    return h.hexdigest()[:16]


def _shard_digest(path: Path) -> str | None:
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("digest")
    except Exception:  # a torn file from a killed run: rewrite it
        return None


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer_ids: list[int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batched, right-padded target forward -> ``(taps [b,S,tD], final_hidden [b,S,D], lse [b,S])``.

    ``lse`` (float32) is the log-sum-exp of the target's logits at every position, computed from the final states
    through the LM head in chunks of positions (:func:`~dscout.training.head.chunked_logsumexp`): the full
    ``[b, S, V]`` logits never exist (at the paper's shapes 4 x 3072 x 151,936 float32 = 7.5 GB).
    """
    from .head import chunked_logsumexp

    out = target(input_ids, layer_ids=layer_ids, attention_mask=attention_mask, last_logits_only=True)
    head = target.lm_head
    lse = chunked_logsumexp(out.final_hidden, head.weight, getattr(head, "bias", None))
    return out.taps, out.final_hidden, lse


def build_feature_cache(target, sequences: list[dict], layer_ids: list[int], out_dir: str | os.PathLike,
                        shard_size: int = 64, batch_size: int = 4, store_dtype: str = "float16",
                        meta: dict | None = None) -> Path:
    """Run the target over ``sequences`` and write the cache (resumable, with a progress bar).

    Args:
        target: :class:`~dscout.models.target.TargetModel`.
        sequences: dicts with ``id``, ``input_ids`` (list[int]) and ``loss_mask`` (list[int]).
        layer_ids: taps to store (the drafter's ``target_layer_ids`` must be a subset).
        out_dir: cache folder.
        shard_size: sequences per shard.
        batch_size: sequences per target forward.
        store_dtype: ``float16`` | ``bfloat16`` | ``float32`` for taps and final hidden states.
        meta: extra provenance written into ``index.json``.
    Returns:
        ``out_dir``.
    Raises:
        OverflowError: if a feature does not fit float16 (choose ``bfloat16``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dt = STORE_DTYPES[store_dtype]
    shards = []
    n_shards = (len(sequences) + shard_size - 1) // shard_size
    bar = tqdm(total=len(sequences), desc="target features", unit="seq", mininterval=2.0)
    for si in range(n_shards):
        chunk = sequences[si * shard_size:(si + 1) * shard_size]
        name = f"shard_{si:05d}.safetensors"
        digest = _digest(chunk, layer_ids)
        shards.append({"file": name, "num_sequences": len(chunk), "digest": digest,
                       "ids": [str(s["id"]) for s in chunk]})
        if (out / name).exists() and _shard_digest(out / name) == digest:
            bar.update(len(chunk))  # written by an earlier, interrupted run over the same sequences
            continue
        taps_l, fin_l, lse_l = [], [], []
        for bi in range(0, len(chunk), batch_size):
            part = chunk[bi:bi + batch_size]
            ids = _pad([torch.tensor(s["input_ids"], dtype=torch.long) for s in part]).to(target.device)
            lens = [len(s["input_ids"]) for s in part]
            am = (torch.arange(ids.shape[1]).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)).long()
            taps, fin, lse = target_features(target, ids, am.to(target.device), layer_ids)
            for j, n in enumerate(lens):
                taps_l.append(taps[j, :n].float().cpu())
                fin_l.append(fin[j, :n].float().cpu())
                lse_l.append(lse[j, :n].cpu())
            bar.update(len(part))
        taps_all = torch.cat(taps_l)
        if dt == torch.float16 and taps_all.abs().max() > 65000:
            raise OverflowError(f"target features exceed float16 range in shard {si}; use store_dtype=bfloat16")
        lengths = torch.tensor([len(s["input_ids"]) for s in chunk])
        tensors = {
            "input_ids": torch.cat([torch.tensor(s["input_ids"], dtype=torch.int32) for s in chunk]),
            "loss_mask": torch.cat([torch.tensor(s["loss_mask"], dtype=torch.uint8) for s in chunk]),
            "taps": taps_all.to(dt).contiguous(),
            "final_hidden": torch.cat(fin_l).to(dt).contiguous(),
            "lse": torch.cat(lse_l).float().contiguous(),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        }
        tmp = out / (name + ".tmp")
        save_file(tensors, str(tmp), metadata={"digest": digest})
        os.replace(tmp, out / name)
    bar.close()
    index = {"num_sequences": len(sequences), "layer_ids": list(layer_ids), "store_dtype": store_dtype,
             "hidden_size": target.hidden_size, "shards": shards, **(meta or {})}
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return out


class FeatureCache:
    """Random access to a cache written by :func:`build_feature_cache`.

    Args:
        path: the cache folder.
        layer_ids: taps the drafter needs, a subset of the cached ones (in the drafter's order).
    Raises:
        FileNotFoundError: if ``index.json`` is missing (the cache was never completed).
        ValueError: if a requested layer is not in the cache.
    """

    def __init__(self, path: str | os.PathLike, layer_ids: list[int] | None = None):
        self.path = Path(path)
        index_file = self.path / "index.json"
        if not index_file.exists():
            raise FileNotFoundError(f"{index_file} missing: the feature cache at {self.path} is incomplete")
        self.index = json.loads(index_file.read_text())
        cached = self.index["layer_ids"]
        layer_ids = list(layer_ids) if layer_ids is not None else cached
        missing = [l for l in layer_ids if l not in cached]
        if missing:
            raise ValueError(f"layers {missing} are not in the feature cache {self.path} (has {cached})")
        d = self.index["hidden_size"]
        cols = [torch.arange(cached.index(l) * d, (cached.index(l) + 1) * d) for l in layer_ids]
        self._cols = torch.cat(cols)
        self._all_cols = layer_ids == cached
        self._loc = []
        for si, sh in enumerate(self.index["shards"]):
            self._loc.extend((si, j) for j in range(sh["num_sequences"]))
        self._handles: dict[int, object] = {}
        self._offsets: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._loc)

    def _open(self, si: int):
        if si not in self._handles:
            f = safe_open(str(self.path / self.index["shards"][si]["file"]), framework="pt")
            self._handles[si] = f
            self._offsets[si] = f.get_tensor("offsets")
        return self._handles[si]

    def get(self, i: int) -> dict:
        """Sequence ``i`` as tensors: input_ids, loss_mask ``[S]``, taps ``[S, tD]``, final_hidden, lse."""
        si, j = self._loc[i]
        f = self._open(si)
        off = self._offsets[si]
        a, b = int(off[j]), int(off[j + 1])
        taps = f.get_slice("taps")[a:b]
        if not self._all_cols:
            taps = taps[:, self._cols]
        return {
            "input_ids": f.get_slice("input_ids")[a:b].long(),
            "loss_mask": f.get_slice("loss_mask")[a:b].long(),
            "taps": taps,
            "final_hidden": f.get_slice("final_hidden")[a:b],
            "lse": f.get_slice("lse")[a:b],
        }

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids [S], loss_mask [S])`` of sequence ``i`` without reading its features."""
        si, j = self._loc[i]
        f = self._open(si)
        a, b = int(self._offsets[si][j]), int(self._offsets[si][j + 1])
        return f.get_slice("input_ids")[a:b].long(), f.get_slice("loss_mask")[a:b].long()

    def batch(self, indices: list[int], dtype: torch.dtype = torch.float32, device="cpu") -> FeatureBatch:
        """Right-padded :class:`FeatureBatch` of the given sequences."""
        items = [self.get(i) for i in indices]
        return FeatureBatch(
            input_ids=_pad([x["input_ids"] for x in items]).to(device),
            loss_mask=_pad([x["loss_mask"] for x in items]).to(device),
            taps=_pad([x["taps"] for x in items]).to(device, dtype),
            final_hidden=_pad([x["final_hidden"] for x in items]).to(device, dtype),
            lse=_pad([x["lse"] for x in items]).to(device, torch.float32),
        )


def tap_rms(batches, skip_first: int = 4, floor: float = 1e-2) -> torch.Tensor:
    """Per-dimension RMS of the taps over some sequences, skipping each one's first positions.

    The first positions hold attention-sink outliers (values in the tens of thousands) that would dominate
    the estimate. Used by :meth:`~dscout.models.drafter.DFlashDrafter.set_tap_scale`.

    Streams: each batch is reduced to a ``[t * D]`` sum of squares and dropped before the next is read, so a
    generator of batches holds one probe batch at a time (35 taps of a 3,072-token sequence are 1 GB in bf16).

    Args:
        batches: iterable (a generator is best) of single-sequence :class:`FeatureBatch` (no padding rows).
    Returns:
        ``[t * D]`` float32, at least ``floor``.
    """
    total, count = None, 0
    for b in batches:
        for i in range(b.taps.shape[0]):
            x = b.taps[i, skip_first:]
            sq = torch.zeros(x.shape[-1], dtype=torch.float32, device=x.device)
            for s in range(0, x.shape[0], 512):  # float32 copies of 512 rows at a time, not of the sequence
                sq += x[s:s + 512].float().pow(2).sum(0)
            total = sq if total is None else total + sq
            count += x.shape[0]
            del x
        del b  # before the generator builds the next batch
    if total is None or count == 0:
        raise ValueError("no positions to estimate the tap scale from")
    return (total / count).sqrt().clamp(min=floor)


def online_batch(target, sequences: list[dict], layer_ids: list[int]) -> FeatureBatch:
    """A :class:`FeatureBatch` computed by the target now (online features, the GPU default)."""
    ids = _pad([torch.tensor(s["input_ids"], dtype=torch.long) for s in sequences]).to(target.device)
    mask = _pad([torch.tensor(s["loss_mask"], dtype=torch.long) for s in sequences]).to(target.device)
    lens = torch.tensor([len(s["input_ids"]) for s in sequences])
    am = (torch.arange(ids.shape[1]).unsqueeze(0) < lens.unsqueeze(1)).long().to(target.device)
    taps, fin, lse = target_features(target, ids, am, layer_ids)
    return FeatureBatch(input_ids=ids, loss_mask=mask, taps=taps, final_hidden=fin, lse=lse)
