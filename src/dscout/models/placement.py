"""Which device a process uses: one rule for every command, ranks of a multi-GPU launch included.

DeepSpeed's launcher (like ``torchrun``) starts one process per GPU, gives every process the same
``CUDA_VISIBLE_DEVICES`` and tells each its slot on the node through ``LOCAL_RANK``. A process that allocates on
``cuda`` before choosing a GPU gets ``cuda:0``: eight ranks would load eight copies of the target onto GPU 0. The
rule here (DeepSpeed's own ``get_accelerator().set_device(local_rank)`` / torchrun's documented
``torch.cuda.set_device(LOCAL_RANK)``) maps local rank ``r`` to ``cuda:r``; :func:`place_process` makes that the
current CUDA device before the target, the drafter, the optimizer state or any batch is allocated.
"""

from __future__ import annotations

import os

import torch

DEVICES = ("auto", "cpu", "cuda")
"""The values of ``target.device`` (schemas/config.schema.yaml)."""


def local_rank_from_env(environ=None) -> int:
    """The process's rank on its node: ``LOCAL_RANK`` as set by DeepSpeed's launcher / torchrun (0 if unset).

    Raises:
        ValueError: if ``LOCAL_RANK`` is set but is not a non-negative integer.
    """
    value = (os.environ if environ is None else environ).get("LOCAL_RANK", "0")
    try:
        rank = int(value)
    except ValueError:
        rank = -1
    if rank < 0:
        raise ValueError(f"environment variable LOCAL_RANK={value!r}: expected a non-negative integer")
    return rank


def rank_device(requested: str = "auto", local_rank: int | None = None, cuda_count: int | None = None
                ) -> torch.device:
    """The device of the process with node-local rank ``local_rank`` for the configured ``target.device``.

    ``cpu`` -> ``cpu``; ``cuda`` -> ``cuda:<local_rank>``; ``auto`` -> ``cuda:<local_rank>`` when the process sees
    a GPU, else ``cpu``. Pure (no CUDA call when ``cuda_count`` is given), so the rule is testable on a CPU.

    Args:
        requested: ``auto``, ``cpu`` or ``cuda`` (config key ``target.device``).
        local_rank: the rank on this node; None reads ``LOCAL_RANK`` (:func:`local_rank_from_env`).
        cuda_count: GPUs this process sees; None asks ``torch.cuda.device_count()``.
    Returns:
        a ``torch.device`` with an explicit index for CUDA (never the bare ``cuda``, which means "the current
        device" and is ``cuda:0`` until someone sets it).
    Raises:
        ValueError: for a ``requested`` outside :data:`DEVICES`.
        RuntimeError: for ``cuda`` without a visible GPU, or a local rank with no GPU of its own (more ranks on a
            node than visible GPUs); the message names ``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES``.
    """
    if requested not in DEVICES:
        raise ValueError(f"target.device: {requested!r} is not one of {list(DEVICES)}")
    if requested == "cpu":
        return torch.device("cpu")
    if local_rank is None:
        local_rank = local_rank_from_env()
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda_count == 0:
        if requested == "auto":
            return torch.device("cpu")
        raise RuntimeError("target.device is 'cuda' but this process sees no GPU (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r})")
    if local_rank >= cuda_count:
        raise RuntimeError(f"LOCAL_RANK={local_rank} has no GPU of its own: this process sees {cuda_count} "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); "
                           "launch at most one rank per GPU (training.num_gpus)")
    return torch.device("cuda", local_rank)


def place_process(requested: str = "auto") -> torch.device:
    """Resolve this process's device (:func:`rank_device` from ``LOCAL_RANK``) and make it the current CUDA device.

    Call before any CUDA allocation: afterwards a bare ``cuda`` (in DeepSpeed, NCCL, or ``tensor.cuda()``) also
    means this rank's GPU.

    Returns:
        the device (``cpu`` or ``cuda:<LOCAL_RANK>``).
    Raises:
        ValueError, RuntimeError: as :func:`rank_device`.
    """
    device = rank_device(requested)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
