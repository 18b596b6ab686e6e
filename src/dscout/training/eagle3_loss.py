"""EAGLE-3's training objective: the training-time test (TTT) unroll with decayed soft cross-entropy.

Implements docs/method.md §6.1 (read from SafeAILab/EAGLE ``eagle/traineagle3/cnets.py``/``main.py`` and
SpecForge ``specforge/training/strategies/base.py``); our own code:

* Data. The frozen target ran once: taps ``g`` ``[b, S, 3H_t]`` and logits ``P`` ``[b, S, V]``. Position ``t``
  pairs ``g_t`` with token ``x_{t+1}`` and is supervised by ``P_{t+1}`` (tokens, targets and mask shifted left by
  one), so a step works on ``n = S - 1`` positions.
* Unroll ``steps`` (upstream 7). Step 0 uses ``u = fc(g)``; step ``k >= 1`` feeds the previous step's outputs
  ``a^{(k-1)}`` (width H, not detached) with tokens ``x_{t+1+k}``, targets ``P_{t+1+k}`` and mask
  ``m_{t+1+k}`` (one more shift per step; positions past the end are padded and unsupervised).
* Attention in step ``k`` (:func:`ttt_attention_mask`): keys are the concatenated per-step K/V
  ``[step 0 ; step 1 ; ... ; step k]``; query ``t`` sees step-0 keys at positions ``<= t`` and the keys of steps
  ``1..k`` at the same position ``t`` only. RoPE position is ``t + k``.
* Loss. ``p = softmax(P restricted to the draft vocabulary)`` (the ids where ``t2d`` is True, in draft order),
  ``L_k = sum_t m_t CE(p_t, q_t) / sum_t m_t`` with ``m_t = loss_mask_t * t2d[argmax P_t]``, and
  ``L = sum_k decay^k L_k``. Upstream divides by every position (``.mean()``); we average over the supervised
  ones, which only rescales each batch's loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ttt_attention_mask(seq_len: int, step: int, device=None) -> torch.Tensor:
    """Boolean attention pattern of TTT step ``step`` over keys ``[step 0 ; ... ; step k]``.

    Args:
        seq_len: ``n``, positions per step.
        step: ``k >= 0``.
    Returns:
        ``[n, (k + 1) n]`` bool (True = may attend): causal block over step-0 keys, then ``k`` identity blocks.
    Raises:
        ValueError: if ``step`` < 0 or ``seq_len`` < 1.
    """
    if step < 0 or seq_len < 1:
        raise ValueError(f"need step >= 0 and seq_len >= 1, got step {step}, seq_len {seq_len}")
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    diag = torch.eye(seq_len, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diag] * step, dim=1)


class _StepKV:
    """Concatenates each step's K/V along the key axis (keeps autograd); ``update`` like a one-layer cache."""

    def __init__(self):
        self.k = self.v = None

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int = 0):
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return self.k, self.v


def _shift_left(x: torch.Tensor, by: int, length: int, fill) -> torch.Tensor:
    """``x[:, by : by + length]`` along dim 1, padded with ``fill`` at the end to ``length``."""
    out = x[:, by:by + length]
    pad = length - out.shape[1]
    if pad > 0:
        tail = torch.full((x.shape[0], pad, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
        out = torch.cat([out, tail], dim=1)
    return out


def ttt_unroll(drafter, input_ids: torch.Tensor, taps: torch.Tensor, steps: int
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the TTT unroll (no loss): ``steps`` drafter passes over ``n = S - 1`` positions each.

    Step ``k`` feeds tokens ``x_{t+1+k}`` (0-padded past the end), hidden ``fc(g_t)`` (k = 0) or ``a^{(k-1)}_t``,
    positions ``t + k`` and the mask :func:`ttt_attention_mask` over the concatenated per-step K/V.

    Args:
        drafter: an :class:`~dscout.models.eagle3.Eagle3Drafter` with its target attached.
        input_ids: ``[b, S]``.
        taps: ``[b, S, 3 H_t]``.
        steps: unroll length.
    Returns:
        ``steps`` pairs ``(a_k [b, n, H], logits_k [b, n, V_d])``; position ``t`` of step ``k`` predicts
        ``x_{t+2+k}`` (supervised by ``P_{t+1+k}``).
    """
    b, S = input_ids.shape
    n = S - 1
    dev = input_ids.device
    pos0 = torch.arange(n, device=dev).unsqueeze(0).expand(b, n)
    kv = _StepKV()
    hidden = taps[:, :n]
    outs = []
    for k in range(steps):
        ids_k = _shift_left(input_ids, 1 + k, n, 0)
        mask = ttt_attention_mask(n, k, dev)[None, None]
        a, logits = drafter(ids_k, hidden, pos0 + k, attention_mask=mask, past_key_values=kv)
        outs.append((a, logits))
        hidden = a
    return outs


def eagle3_ttt_loss(drafter, input_ids: torch.Tensor, loss_mask: torch.Tensor, taps: torch.Tensor,
                    target_logits: torch.Tensor, steps: int = 7, decay: float = 0.8
                    ) -> tuple[torch.Tensor, dict]:
    """The EAGLE-3 training-time-test loss of one micro-batch (docs/method.md §6.1).

    Args:
        drafter: an :class:`~dscout.models.eagle3.Eagle3Drafter` with its target attached.
        input_ids: ``[b, S]`` tokens (right-padded).
        loss_mask: ``[b, S]`` 1 where the target distribution ``P_t`` is a supervision target (aligned with
            ``target_logits``; shifted together with it).
        taps: ``[b, S, 3 H_t]`` target taps at ``drafter.config.target_layer_ids``.
        target_logits: ``[b, S, V]`` target logits (no gradient flows into them).
        steps: TTT unroll length (upstream 7).
        decay: per-step loss weight base (upstream 0.8).
    Returns:
        ``(loss, metrics)``; metrics ``loss`` (float), ``step_loss``, ``step_accuracy`` (top-1 of drafter vs
        restricted target over supervised positions) and ``step_supervised`` (counts), lists of length ``steps``.
    Raises:
        ValueError: if ``steps`` < 1, ``S`` < 2, or the shapes disagree.
    """
    b, S = input_ids.shape
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if S < 2:
        raise ValueError(f"need at least 2 tokens per sequence, got {S}")
    if loss_mask.shape != (b, S) or taps.shape[:2] != (b, S) or target_logits.shape[:2] != (b, S):
        raise ValueError(f"shape mismatch: input_ids {tuple(input_ids.shape)}, loss_mask {tuple(loss_mask.shape)}, "
                         f"taps {tuple(taps.shape)}, target_logits {tuple(target_logits.shape)}")
    dev = input_ids.device
    t2d = drafter.t2d.to(dev)
    used = t2d.nonzero().flatten()  # target ids of draft ids 0..V_d-1 (ascending)
    with torch.no_grad():
        P = target_logits.detach().float()
        m_full = loss_mask.float() * t2d[P.argmax(-1)].float()  # [b, S]
        Pd = P.index_select(-1, used)  # [b, S, V_d]
        p_full = Pd.softmax(-1)
        arg_full = Pd.argmax(-1)

    outs = ttt_unroll(drafter, input_ids, taps, steps)
    total = torch.zeros((), device=dev)
    step_loss, step_acc, step_sup = [], [], []
    for k, (_a, logits) in enumerate(outs):
        live = S - 1 - k  # positions whose target P_{t+1+k} exists
        if live <= 0:
            step_loss.append(0.0)
            step_acc.append(0.0)
            step_sup.append(0)
            continue
        logq = F.log_softmax(logits[:, :live].float(), dim=-1)
        p_k, m_k, arg_k = p_full[:, 1 + k:], m_full[:, 1 + k:], arg_full[:, 1 + k:]
        ce = -(p_k * logq).sum(-1)  # [b, live]
        count = m_k.sum()
        loss_k = (ce * m_k).sum() / count.clamp_min(1.0)
        total = total + (decay ** k) * loss_k
        with torch.no_grad():
            hit = (logq.argmax(-1) == arg_k).float()
            step_loss.append(float(loss_k))
            step_acc.append(float((hit * m_k).sum() / count.clamp_min(1.0)))
            step_sup.append(int(count))
    metrics = {"loss": float(total.detach()), "step_loss": step_loss, "step_accuracy": step_acc,
               "step_supervised": step_sup}
    return total, metrics
