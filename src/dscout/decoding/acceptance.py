"""Verification rules for a chain of drafts: greedy and lossless speculative sampling.

For drafts ``d_1..d_k`` verified in one target forward over ``[x, d_1, ..., d_k]`` the target returns logits
``L_0..L_k``; ``L_i`` is the target's next-token distribution after ``d_i`` (``d_0 := x``).

* **Greedy** (temperature 0): accept the longest prefix with ``d_{i+1} == argmax L_i``; the bonus token is
  ``argmax L_n`` at the first mismatch (or after the last draft). The committed text equals autoregressive
  greedy decoding token for token.
* **Sampling** (temperature T > 0): the standard rule (docs/method.md §1): accept ``d`` with probability
  ``min(1, p(d) / q(d))``; on rejection sample from ``norm(max(0, p - q))``; if every draft is accepted,
  sample the bonus from ``p_k``. With a deterministic (greedy) drafter ``q`` is one-hot, so ``d`` is accepted
  with probability ``p(d)`` and a rejection samples from ``p`` with ``d`` removed (docs/method.md §1,
  SGLang ``tree_speculative_sampling_target_only``). Either way the output follows the target distribution.
"""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` in float32 over the last dimension."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy chain verification.

    Args:
        draft_tokens: ``[k]`` drafts ``d_1..d_k``.
        target_logits: ``[k + 1, V]`` target logits after ``x, d_1, ..., d_k``.
    Returns:
        ``(n_accepted, bonus_token)``; ``0 <= n_accepted <= k``; the round commits ``n_accepted + 1`` tokens.
    """
    k = draft_tokens.shape[0]
    target_argmax = target_logits.argmax(dim=-1)
    if k == 0:
        return 0, int(target_argmax[0])
    match = (draft_tokens == target_argmax[:k]).int()
    n = int(torch.cumprod(match, dim=0).sum())
    return n, int(target_argmax[n])


def commit_round(output_ids: list[int], tokens: list[int], stop_token_ids) -> tuple[int, bool]:
    """Append one round's committed tokens (accepted drafts, then the bonus) to ``output_ids``, stopping after the
    first stop token.

    Shared by the single-request and the batched engine, so both count a round alike: the accept length of a
    round is what it committed (a stop token inside the accepted block ends the round there).

    Returns:
        ``(emitted, stopped)``: tokens appended (the round's accept length) and whether a stop token was hit.
    """
    emitted = 0
    for tok in tokens:
        output_ids.append(tok)
        emitted += 1
        if tok in stop_token_ids:
            return emitted, True
    return emitted, False


def speculative_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float,
                       generator: torch.Generator, draft_probs: torch.Tensor | None = None) -> tuple[int, int]:
    """Lossless chain verification at temperature ``T > 0``.

    Args:
        draft_tokens: ``[k]``.
        target_logits: ``[k + 1, V]``.
        temperature: T > 0 applied to the target logits.
        generator: RNG for the accept coins and the residual / bonus samples.
        draft_probs: ``[k, V]`` the drafter's distributions the drafts were sampled from, or None for
            deterministic drafts (one-hot q).
    Returns:
        ``(n_accepted, bonus_token)``.
    Raises:
        ValueError: if ``temperature <= 0`` (use :func:`greedy_accept`).
    """
    if temperature <= 0:
        raise ValueError("speculative_accept needs temperature > 0; use greedy_accept at temperature 0")
    p = target_probs(target_logits, temperature)
    k = draft_tokens.shape[0]
    coins = torch.rand(k, generator=generator, device=p.device) if k else None
    for i in range(k):
        d = int(draft_tokens[i])
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        p_d = float(p[i, d])
        if q_d > 0 and float(coins[i]) < min(1.0, p_d / q_d):
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = torch.clamp(p[i] - draft_probs[i].float(), min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: any sample from p is exact
            residual, total = p[i], 1.0
        bonus = int(torch.multinomial(residual / total, 1, generator=generator))
        return i, bonus
    bonus = int(torch.multinomial(p[k], 1, generator=generator))
    return k, bonus


def accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float,
           generator: torch.Generator | None = None, draft_probs: torch.Tensor | None = None) -> tuple[int, int]:
    """Dispatch: greedy at ``temperature == 0``, lossless sampling otherwise."""
    if temperature <= 0:
        return greedy_accept(draft_tokens, target_logits)
    return speculative_accept(draft_tokens, target_logits, temperature, generator, draft_probs)


# ------------------------------------------------------------------------------------------- trees
def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node (root children have depth 1). ``parents[i]`` is -1 (root) or an earlier index.

    Raises:
        ValueError: if a parent index does not precede its child (the tree must be topologically ordered).
    """
    depth = torch.zeros(parents.shape[0], dtype=torch.long)
    for i, p in enumerate(parents.tolist()):
        if p >= i:
            raise ValueError(f"tree node {i} has parent {p}: parents must precede children")
        depth[i] = 1 if p < 0 else depth[p] + 1
    return depth


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """``[n + 1, n + 1]`` bool: row i (0 = root, node j at i = j + 1) may see column c iff c is an ancestor-or-self.

    The verify forward of a tree feeds ``[root, node_0, ..., node_{n-1}]``; with this block (plus the whole
    cached prefix) each node attends exactly to its root->node path, as in EAGLE's tree verification
    (docs/method.md §6.1).
    """
    n = parents.shape[0]
    m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    m[:, 0] = True
    for j, p in enumerate(parents.tolist()):
        i = j + 1
        m[i, i] = True
        if p >= 0:
            m[i] |= m[p + 1]
    return m


def retrieve_indices(parents: torch.Tensor) -> torch.Tensor:
    """Root->leaf paths in verify order (0 = root, node j = j + 1), one row per leaf, padded with -1.

    Returns:
        ``[num_leaves, max_depth + 1]`` long (EAGLE's ``retrieve_indices``).
    """
    n = parents.shape[0]
    has_child = torch.zeros(n, dtype=torch.bool)
    for p in parents.tolist():
        if p >= 0:
            has_child[p] = True
    paths = []
    for j in range(n):
        if has_child[j]:
            continue
        path, k = [], j
        while k >= 0:
            path.append(k + 1)
            k = int(parents[k])
        paths.append([0] + path[::-1])
    if not paths:
        return torch.zeros(1, 1, dtype=torch.long)
    width = max(len(p) for p in paths)
    return torch.tensor([p + [-1] * (width - len(p)) for p in paths], dtype=torch.long)


def greedy_tree_accept(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy tree verification: the root->leaf path with the longest accepted prefix.

    Args:
        tokens: ``[n]`` node tokens; parents: ``[n]``; logits: ``[n + 1, V]`` target logits in verify order.
    Returns:
        ``(accepted node indices in path order, bonus token)``; the round commits ``len(path) + 1`` tokens.
    """
    target_argmax = logits.argmax(-1)  # [n + 1]
    best, best_len = [], -1
    for row in retrieve_indices(parents).tolist():
        acc = []
        for a, b in zip(row, row[1:]):
            if b < 0 or int(tokens[b - 1]) != int(target_argmax[a]):
                break
            acc.append(b)
        if len(acc) > best_len:
            best, best_len = acc, len(acc)
    last = best[-1] if best else 0
    return [b - 1 for b in best], int(target_argmax[last])


def sampling_tree_accept(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor, temperature: float,
                         generator: torch.Generator) -> tuple[list[int], int]:
    """Lossless tree walk for deterministic drafts (EAGLE ``evaluate_posterior``; docs/method.md §6.1).

    At node u with target distribution p, try u's children in order: accept child token x with probability
    p(x); on rejection set p(x) = 0, renormalise and try the next child; on acceptance descend. When no child is
    accepted (or at a leaf) the bonus is sampled from the current residual p. The committed tokens follow the
    target distribution exactly (each step is the one-hot-draft rule applied sibling by sibling).
    """
    if temperature <= 0:
        raise ValueError("sampling_tree_accept needs temperature > 0")
    children: dict[int, list[int]] = {}
    for j, p in enumerate(parents.tolist()):
        children.setdefault(p + 1, []).append(j + 1)
    node, path = 0, []
    while True:
        p = target_probs(logits[node], temperature).clone()
        moved = False
        for c in children.get(node, []):
            x = int(tokens[c - 1])
            px = float(p[x])
            if px > 0 and float(torch.rand(1, generator=generator)) < px:
                path.append(c - 1)
                node, moved = c, True
                break
            p[x] = 0.0
            total = float(p.sum())
            if total <= 0:
                break
            p = p / total
        if not moved:
            return path, int(torch.multinomial(p, 1, generator=generator))
