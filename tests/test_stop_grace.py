"""The stop signal's grace period must cover a checkpoint save: the trainer times every save (training_summary.json
``checkpoint_save_seconds``; the one after SIGTERM on stderr), and a requeued run resumes from the saved step."""

import json
import os
import signal
import threading
import time

import pytest
import torch

from dscout.training.features import build_feature_cache
from dscout.training.trainer import TrainConfig, TrainingInterrupted, train_drafter

from .conftest import greedy_sequences, tiny_target


@pytest.mark.filterwarnings("ignore:the mask token id")  # a 64-token toy vocabulary has no unused id
def test_sigterm_save_is_timed_and_the_rerun_records_its_saves(tmp_path, monkeypatch, capfd):
    t = tiny_target(dtype=torch.float32, seed=5, init=0.3)
    build_feature_cache(t, greedy_sequences(t, n=8, new_tokens=24), [1, 3], tmp_path / "cache", shard_size=8)
    cfg = TrainConfig(recipe="dscout", num_layers=1, target_layer_ids=[1, 3], mask_token_id=63, num_anchors=4,
                      micro_batch_size=2, lr=3e-3, max_steps=5, checkpoint_every=2, seed=3)
    work = tmp_path / "work"
    from dscout.training import trainer
    from tests.fault_injection.sitecustomize import pause_before_update

    def send_sigterm():
        deadline = time.monotonic() + 120
        while not (work / "paused.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send_sigterm)
    sender.start()
    with monkeypatch.context() as mp, pytest.raises(TrainingInterrupted):
        # rank 0 waits in update 2 (index) for the signal, which that update's gather then carries
        pause_before_update(trainer, 2, work / "paused.json", mp.setattr)
        train_drafter(t, cfg, tmp_path / "out", work, feature_cache=str(tmp_path / "cache"))
    sender.join()
    err = capfd.readouterr().err
    assert "checkpoint at step 3 saved in" in err and "after signal 15" in err
    train_drafter(t, cfg, tmp_path / "out", work, feature_cache=str(tmp_path / "cache"))
    summary = json.loads((tmp_path / "out" / "training_summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 5
    saves = summary["checkpoint_save_seconds"]  # this run's saves: step 4 (checkpoint_every 2; none at the end)
    assert len(saves) == 1 and saves[0] > 0
