"""The ZeRO-3 dummy media row: the vision tower runs (forward and backward) while real rows are unchanged.

The trainer asks the other processes which kinds of media their micro-batches hold (`vision_dummy.media_needed`, an
all-reduce); here a real one-process gloo group answers. Processes holding different kinds run in
`tests/test_distributed.py`."""

from __future__ import annotations

import socket

import pytest
import torch
from conftest import color_rows
from test_shared_prefix import logps_and_grads, make_trainer, rollout_batch

from vlm_grpo.testing import DEFAULT_FAMILY


@pytest.fixture
def one_process_group():
    """A real one-process gloo process group, destroyed afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("share", [False, True])
def test_text_only_chunk_runs_vision_tower_without_changing_results(
    share, tiny_model, tmp_path, one_process_group
):
    trainer = make_trainer(tiny_model(DEFAULT_FAMILY), tmp_path)
    batch = rollout_batch(trainer, [color_rows(3, text_only_every=1)[i] for i in (0, 2)])  # text-only rows
    calls = {"vision": 0}
    hook = trainer.model.model.visual.register_forward_hook(
        lambda m, i, o: calls.__setitem__("vision", calls["vision"] + 1)
    )
    plain_logps, plain_ent, plain_grads = logps_and_grads(trainer, batch, share)
    assert calls["vision"] == 0
    trainer._logps.dummy_rows = True  # as under multi-process ZeRO-3
    logps, ent, grads = logps_and_grads(trainer, batch, share)
    hook.remove()
    assert calls["vision"] == 2  # one dummy image per chunk of 4 rows (6 rows)
    assert torch.allclose(logps, plain_logps, atol=1e-6, rtol=0)
    assert torch.allclose(ent, plain_ent, atol=1e-6, rtol=0)
    vision = [n for n in grads if trainer.family.is_vision_module(n)]
    assert vision and all(not grads[n].any() for n in vision)  # reached by the backward, with zero gradient
    assert all(torch.allclose(grads[n], g, atol=1e-6, rtol=1e-5) for n, g in plain_grads.items())
