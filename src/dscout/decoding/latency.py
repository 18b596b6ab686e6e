"""A latency model of one draft round, T(t, d, bs, c), calibrated on the machine that decodes.

A round of block-diffusion speculative decoding (docs/method.md §4, §5) at concurrency c costs, in seconds,

    T(bs, c) = T_verify(bs, c) + [bs > 1] * (T_draft(bs, c) + T_commit(m, c))

* ``T_draft(bs, c) = f_0 + f_1 * c * bs + d * (l_0 + l_1 * c * bs)``: **one** drafter forward over the c requests'
  blocks of ``bs`` tokens with ``d`` layers (:class:`~dscout.decoding.proposers.BatchedBlockDiffusionProposer`);
  the fixed part (``f_0``, ``d l_0``) is paid once per round, not once per request; the per-token part (embedding,
  fusion, the layers, the head over ``bs - 1`` positions, attention to the context) grows with the ``c * bs``
  block tokens. The paper's ``T_d = T_fix + d * T_layer`` (docs/method.md §5) is the slice at fixed bs and c.
* ``T_commit(m, c) = m_0 + m_1 * c * m``: writing the ``m`` kept tokens per request (padded to the most over the
  requests) into the drafter's context cache. Commits are deferred into the next draft forward, so the catch-up
  is paid only by rounds that draft, and a round at bs 1 costs the verify alone. In steady drafting ``m`` is the
  previous round's committed length L; after skipped rounds it is the backlog. ``t`` enters here and in ``f``
  through the fused context. Calibration fits ``m_1`` jointly with the draft term (``m_0`` = 0: the catch-up
  rides in the draft forward).
* ``T_verify(bs, c) = v_0 + v_1 * c + v_2 * c * bs``: one target forward over ``c`` rows of ``bs`` tokens. At a
  calibrated c the measured verify times are interpolated between the calibrated bs instead (a verify of a few
  tokens is memory-bound and kernels change cost in steps, which a straight line smooths over); the line serves
  other c and extrapolates below the smallest and above the largest calibrated bs (from the nearest measured point
  with the line's slope).

:func:`calibrate_latency` measures every term on the real target and drafter (synthetic context of
``context_tokens`` tokens, median of ``repeats`` timings per point; drafter-layer slices ``1..d`` for the
``d`` term) and fits the coefficients by least squares; :class:`LatencyModel` keeps the measured points, so a
run saves its calibration (``to_json``) and a report shows the fit against measured round times. The online
block-size controller (:mod:`dscout.decoding.controller`) maximises expected tokens per second with it.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares, minimum norm (collinear columns, e.g. a single d, still predict inside the data)."""
    import torch  # here, not at module level: the model itself is torch-free (figures read it in the plot env)

    a = torch.tensor(rows, dtype=torch.float64)
    b = torch.tensor(ys, dtype=torch.float64).view(-1, 1)
    return torch.linalg.lstsq(a, b, driver="gelsd").solution.view(-1).tolist()


def monotone_fit(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The least-squares non-decreasing fit of ``(bs, seconds)`` points sorted by bs (pool-adjacent-violators).

    Adjacent points that decrease are pooled to their mean until the sequence no longer decreases; monotone
    input comes back unchanged.

    Args:
        points: ``[(bs, seconds)]`` sorted by bs.
    Returns:
        the same bs with fitted seconds, non-decreasing.
    """
    blocks: list[list[float]] = []  # [sum of seconds, count]
    for _, t in points:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    fitted = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    return [(bs, t) for (bs, _), t in zip(points, fitted)]


@dataclass
class LatencyModel:
    """Seconds per draft round of one (target, drafter) pair on one machine.

    Attributes:
        num_taps: conditioning depth t of the drafter; num_layers: drafter depth d.
        draft: ``[f_0, f_1, l_0, l_1]``: ``T_draft(bs, c) = f_0 + f_1 c bs + d (l_0 + l_1 c bs)`` seconds (one
            forward for the c requests).
        commit: ``[m_0, m_1]``: ``T_commit(m, c) = m_0 + m_1 c m`` seconds (m kept tokens per request, one pass).
        verify: ``[v_0, v_1, v_2]``: ``T_verify(bs, c) = v_0 + v_1 c + v_2 c bs`` seconds.
        verify_table: ``{c: {bs: seconds}}``, the measured verify medians (JSON keys are strings); read through
            :func:`monotone_fit` (non-decreasing in bs).
        context_tokens: the context length (tokens) the rounds were calibrated at.
        samples: the calibration measurements (``part`` draft/verify (or legacy commit), ``bs``, ``c``,
            ``layers``, ``tokens``, ``pending`` (kept tokens per request written by that draft), ``seconds``).
        calibration_seconds: wall time the calibration took.
    """

    num_taps: int
    num_layers: int
    draft: list[float]
    commit: list[float]
    verify: list[float]
    samples: list[dict] = field(default_factory=list)
    calibration_seconds: float = 0.0
    verify_table: dict = field(default_factory=dict)
    context_tokens: int | None = None

    def __post_init__(self):
        # the table as sorted (bs, seconds) points per c, once: verify_seconds runs for every candidate bs per round;
        # made non-decreasing in bs (verifying more tokens never costs less; a dip is timing noise, which the
        # controller would otherwise exploit, e.g. bs 8 "cheaper" than bs 4)
        self._verify_points = {int(c): monotone_fit(sorted((int(b), t) for b, t in row.items()))
                               for c, row in self.verify_table.items() if row}

    def draft_seconds(self, bs: int, layers: int | None = None, concurrency: int = 1) -> float:
        """One drafter forward over ``concurrency`` blocks of ``bs`` tokens with ``layers`` (default d) layers,
        seconds (0 for bs 1: nothing to draft)."""
        if bs <= 1:
            return 0.0
        d = self.num_layers if layers is None else layers
        f0, f1, l0, l1 = self.draft
        n = concurrency * bs
        return max(f0 + f1 * n + d * (l0 + l1 * n), 0.0)

    def commit_seconds(self, tokens: float, concurrency: int = 1) -> float:
        """Writing ``tokens`` kept tokens of each of ``concurrency`` requests into the drafter's context (one
        batched pass, fused into the next draft forward), seconds."""
        return max(self.commit[0] + self.commit[1] * concurrency * tokens, 0.0)

    def verify_seconds(self, bs: int, concurrency: int = 1) -> float:
        """One target forward over ``concurrency`` rows of ``bs`` tokens, seconds (measured table where it covers
        ``(bs, c)``, else the fitted line)."""
        v0, v1, v2 = self.verify
        line = max(v0 + v1 * concurrency + v2 * concurrency * bs, 1e-9)
        points = self._verify_points.get(concurrency)
        if not points:
            return line
        if bs <= points[0][0]:  # below the calibrated range: the line's slope from the first measured point
            return max(points[0][1] - v2 * concurrency * (points[0][0] - bs), 1e-9)
        for (b0, t0), (b1, t1) in zip(points, points[1:]):
            if bs <= b1:
                return t0 + (t1 - t0) * (bs - b0) / (b1 - b0)
        # above the calibrated range: never below the last measured point plus the line's slope (the line alone
        # can sit below the measurements there and would make long blocks look cheap)
        return max(line, points[-1][1] + v2 * concurrency * (bs - points[-1][0]))

    def round_seconds(self, bs: int, concurrency: int = 1, committed: float | None = None,
                      pending: float | None = None) -> float:
        """T(bs, c): a whole round, seconds: one verify, and for bs > 1 one batched draft forward with its catch-up.

        Args:
            committed: expected tokens committed per request by a round (default: bs, an upper bound); in steady
                drafting the next draft writes them, so they price this round's catch-up.
            pending: tokens per request this round's draft must write first (default ``committed``).
        """
        t = self.verify_seconds(bs, concurrency)
        if bs <= 1:
            return t
        m = (bs if committed is None else committed) if pending is None else pending
        return t + self.draft_seconds(bs, concurrency=concurrency) + self.commit_seconds(m, concurrency)

    @classmethod
    def fit(cls, samples: list[dict], num_taps: int, num_layers: int, calibration_seconds: float = 0.0
            ) -> "LatencyModel":
        """Least-squares fit of the three terms from calibration samples.

        Draft samples (``part: draft``) give ``c``, ``bs``, ``layers`` and the kept tokens per request their
        forward wrote first (``pending``, default 0); the draft coefficients and the catch-up slope ``m_1`` are
        one fit over them. Legacy ``part: commit`` samples (a separate write of ``tokens`` per request) are used
        for the commit term when no draft sample wrote kept tokens.

        Raises:
            ValueError: if draft or verify samples are missing, or nothing measures the commit term.
        """
        parts = {p: [s for s in samples if s["part"] == p] for p in ("draft", "commit", "verify")}
        for p in ("draft", "verify"):
            if not parts[p]:
                raise ValueError(f"latency calibration has no '{p}' samples")
        rows = [[1.0, s.get("c", 1) * s["bs"], s["layers"], s["layers"] * s.get("c", 1) * s["bs"],
                 s.get("c", 1) * s.get("pending", 0)] for s in parts["draft"]]
        coef = _lstsq(rows, [s["seconds"] for s in parts["draft"]])
        draft = coef[:4]
        if any(s.get("pending", 0) > 0 for s in parts["draft"]):
            commit = [0.0, coef[4]]
        elif parts["commit"]:
            commit = _lstsq([[1.0, s.get("c", 1) * s["tokens"]] for s in parts["commit"]],
                            [s["seconds"] for s in parts["commit"]])
        else:
            raise ValueError("latency calibration measures no commit: no draft sample with 'pending' > 0 and no "
                             "'commit' samples")
        verify = _lstsq([[1.0, s["c"], s["c"] * s["bs"]] for s in parts["verify"]],
                        [s["seconds"] for s in parts["verify"]])
        table: dict[str, dict[str, float]] = {}
        for smp in parts["verify"]:
            table.setdefault(str(smp["c"]), {})[str(smp["bs"])] = smp["seconds"]
        return cls(num_taps, num_layers, draft, commit, verify, list(samples), calibration_seconds, table)

    def to_json(self, path: str | Path) -> None:
        """Write the model and its calibration samples (saved with the run)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "LatencyModel":
        """Read a model written by :meth:`to_json`."""
        return cls(**json.loads(Path(path).read_text()))


def _median_seconds(fn, repeats: int, device) -> float:
    from .engine import _sync  # CUDA launches are asynchronous: wait for the kernels inside each timing

    fn()  # warm-up: first-call allocations out of the timing
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate_latency(target, proposer, block_sizes: list[int], concurrency: list[int] = (1,),
                      context_tokens: int = 128, repeats: int = 5, seed: int = 0) -> LatencyModel:
    """Measure draft, commit and verify costs on this machine and fit :class:`LatencyModel`.

    Args:
        target: :class:`~dscout.models.target.TargetModel`.
        proposer: a :class:`~dscout.decoding.proposers.BlockDiffusionProposer` (its drafter is timed in the
            batched form the engines use: ``1..d`` of its layers at the smallest c for the d term, all d layers at
            every c, and forwards that first write ``horizon`` and ``4 * horizon`` kept tokens per request for the
            catch-up term; the layers are restored afterwards).
        block_sizes: bs values to time (each ``>= 2`` and ``<=`` the drafter's horizon for the draft term).
        concurrency: c values for the verify and draft terms (rows of one target / drafter forward).
        context_tokens: length of the synthetic context (random token ids) the round attends to.
        repeats: timings per point (median).
    Returns:
        The fitted model, with its samples and the calibration's wall seconds.
    Raises:
        ValueError: for an empty ``block_sizes``.
    """
    import torch

    if not block_sizes:
        raise ValueError("calibrate_latency needs at least one block size")
    with torch.no_grad():
        return _calibrate(target, proposer, block_sizes, concurrency, context_tokens, repeats, seed)


def _calibrate(target, proposer, block_sizes, concurrency, context_tokens, repeats, seed) -> LatencyModel:
    import torch

    from .engine import _sync

    t_start = time.perf_counter()
    dev = target.device
    g = torch.Generator().manual_seed(seed)
    vocab = min(int(target.vocab_size), 32000)
    samples = []
    drafter = proposer.drafter
    d = len(drafter.layers)
    layer_ids = list(proposer.layer_ids)

    # prefill one context of c rows, the largest c; smaller c use its first rows
    cmax = max(concurrency)
    ids = torch.randint(1, vocab, (cmax, context_tokens), generator=g).to(dev)
    cache = target.new_cache()
    out = target(ids, layer_ids=layer_ids, past_key_values=cache)
    base = [copy.deepcopy(cache)]

    max_bs = min(max(block_sizes), proposer.max_block_size)
    for bs in sorted(set(block_sizes)):
        for c in sorted(set(concurrency)):
            sub = copy.deepcopy(base[0])
            if c < cmax:
                for layer in sub.layers:
                    layer.keys, layer.values = layer.keys[:c], layer.values[:c]
            block = torch.randint(1, vocab, (c, bs), generator=g).to(dev)

            def verify(sub=sub, block=block, bs=bs):
                target(block, layer_ids=layer_ids, past_key_values=sub)
                sub.crop(-bs)

            samples.append({"part": "verify", "bs": bs, "c": c, "layers": None, "tokens": c * bs,
                            "seconds": _median_seconds(verify, repeats, dev)})
    group = proposer.batched() if callable(getattr(proposer, "batched", None)) else None
    if group is None:
        from .proposers import BatchedBlockDiffusionProposer

        group = BatchedBlockDiffusionProposer(drafter)
    sizes = sorted(b for b in set(block_sizes) if 2 <= b <= max_bs)
    token = int(ids[0, -1])
    layers = drafter.layers
    cmin = min(concurrency)
    try:  # the d term: 1..d layers at the smallest c; the c term: every c at d layers
        for c in sorted(set(concurrency)):
            ctx = out.taps[:c]
            for j in (range(1, d + 1) if c == cmin else [d]):
                drafter.layers = torch.nn.ModuleList(list(layers)[:j])
                group.start(ctx)
                for bs in sizes:
                    def draft(bs=bs, c=c):
                        group.propose([token] * c, [context_tokens] * c, [bs - 1] * c)

                    samples.append({"part": "draft", "bs": bs, "c": c, "layers": j, "tokens": c * bs, "pending": 0,
                                    "seconds": _median_seconds(draft, repeats, dev)})
    finally:
        drafter.layers = layers
    # the catch-up: a draft forward that first writes m kept tokens per request (context length unchanged)
    b0 = sizes[0] if sizes else 2
    for c in sorted(set(concurrency)):
        ctx = out.taps[:c]
        for m in sorted({max_bs, 4 * max_bs}):
            m = min(m, context_tokens - 1)

            def catchup(m=m, c=c):
                group.start(ctx[:, : context_tokens - m])
                for i in range(c):
                    group.commit(i, ctx[i, context_tokens - m:])
                _sync(dev)
                t0 = time.perf_counter()
                group.propose([token] * c, [context_tokens] * c, [b0 - 1] * c)
                _sync(dev)
                return time.perf_counter() - t0

            catchup()
            secs = statistics.median(catchup() for _ in range(repeats))
            samples.append({"part": "draft", "bs": b0, "c": c, "layers": d, "tokens": c * b0, "pending": m,
                            "seconds": secs})
    num_taps = len(layer_ids)
    model = LatencyModel.fit(samples, num_taps, d, time.perf_counter() - t_start)
    model.context_tokens = context_tokens
    return model


__all__ = ["LatencyModel", "calibrate_latency", "monotone_fit"]
