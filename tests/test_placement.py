"""Rank placement (dscout.models.placement): the device of each rank of a launch comes from LOCAL_RANK."""

import json
import os
import socket

import pytest
import torch

from dscout.models.placement import local_rank_from_env, place_process, rank_device


def test_cuda_ranks_get_their_own_gpu():
    assert [rank_device("cuda", r, cuda_count=8) for r in range(8)] == [torch.device("cuda", r) for r in range(8)]
    assert rank_device("auto", 3, cuda_count=4) == torch.device("cuda", 3)
    assert str(rank_device("cuda", 0, cuda_count=1)) == "cuda:0"  # an explicit index, never the bare "cuda"


def test_cpu_and_auto_without_gpus():
    assert rank_device("cpu", 5, cuda_count=8) == torch.device("cpu")
    assert rank_device("auto", 1, cuda_count=0) == torch.device("cpu")


def test_bad_requests_are_refused_with_the_reason(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=2 has no GPU of its own: this process sees 2 "
                                           r"\(CUDA_VISIBLE_DEVICES='0,1'\)"):
        rank_device("cuda", 2, cuda_count=2)
    with pytest.raises(RuntimeError, match="target.device is 'cuda' but this process sees no GPU"):
        rank_device("cuda", 0, cuda_count=0)
    with pytest.raises(ValueError, match=r"target.device: 'cuda:1' is not one of \['auto', 'cpu', 'cuda'\]"):
        rank_device("cuda:1", 0, cuda_count=2)


def test_local_rank_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert local_rank_from_env() == 0
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert local_rank_from_env() == 5 and rank_device("cuda", cuda_count=8) == torch.device("cuda", 5)
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x': expected a non-negative integer"):
        local_rank_from_env()


def test_place_process_on_this_machine(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    dev = place_process("auto")
    assert dev == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    if torch.cuda.is_available():
        assert torch.cuda.current_device() == 0


def _rank_main(rank, world, port, out_dir):
    """One rank of a gloo launch: the environment a launcher gives it, then the device it resolves for a
    ``cuda`` config on a node with ``world`` GPUs, gathered on every rank."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mine = {"rank": rank, "local_rank": local_rank_from_env(), "device": str(rank_device("cuda", cuda_count=world))}
        out = [None] * world
        torch.distributed.all_gather_object(out, mine)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        torch.distributed.destroy_process_group()


def test_two_gloo_ranks_resolve_distinct_gpus_for_a_cuda_config(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank_main, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    want = [{"rank": 0, "local_rank": 0, "device": "cuda:0"}, {"rank": 1, "local_rank": 1, "device": "cuda:1"}]
    for r in range(2):  # every rank saw what every rank resolved
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == want
