"""Batches read each of TRL's repeated prompts once: the same rows, in the same order, each image decoded once."""

from __future__ import annotations

import PIL.Image
from conftest import color_dataset, grpo_args, length_reward

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.data.rows import GroupRows, repeat_row
from vlm_grpo.testing import DEFAULT_FAMILY


def _same_row(row: dict, reference: dict) -> None:
    assert row["prompt"] == reference["prompt"] and row["solution"] == reference["solution"]
    assert [i.tobytes() for i in row["images"]] == [i.tobytes() for i in reference["images"]]


def test_a_batch_decodes_each_repeated_prompt_once_and_copies_the_rest(monkeypatch):
    dataset = color_dataset(4)
    opened = []
    real_open = PIL.Image.open
    monkeypatch.setattr(PIL.Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    indices = [2, 2, 2, 0, 0, 0]
    dataset.__getitems__(indices)
    repeated = len(opened)
    opened.clear()
    rows = GroupRows(dataset).__getitems__(indices)
    assert len(opened) * 3 == repeated > 0  # each prompt's image decoded once, not at each of its three rows
    for row, i in zip(rows, indices, strict=True):
        _same_row(row, dataset[i])
    assert rows[0]["images"][0] is rows[1]["images"][0] is rows[2]["images"][0]
    assert rows[0]["images"][0] is not rows[3]["images"][0]
    rows[1]["prompt"][0]["content"] = "changed"
    rows[1]["images"].append(None)
    assert rows[0]["prompt"] == rows[2]["prompt"] == dataset[2]["prompt"]
    assert len(rows[0]["images"]) == len(rows[2]["images"]) == 1


def test_repeat_row_keeps_the_row_and_copies_it():
    row = color_dataset(1)[0]
    rows = repeat_row(row, 3)
    assert rows[0] is row and all(r is not row and r == row for r in rows[1:])
    assert repeat_row(row, 1) == [row]


def test_the_training_loader_gives_the_rows_trls_sampler_draws(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, per_device_train_batch_size=6, num_generations=3),
        train_dataset=color_dataset(8),
    )
    batch = next(iter(trainer.get_train_dataloader()))
    indices = list(trainer._get_train_sampler(trainer.train_dataset))[: len(batch)]
    assert len(batch) == 6 and len(set(indices)) == 2
    for row, i in zip(batch, indices, strict=True):
        _same_row(row, trainer.train_dataset[i])
    for group in (batch[:3], batch[3:]):
        assert group[0]["images"][0] is group[1]["images"][0] is group[2]["images"][0]


def test_a_refill_round_reads_each_fresh_prompt_once(tiny_model, tmp_path):
    """Dynamic sampling's refill reads a fresh prompt's row once: the read that checks it was not drawn yet is the
    one its rows are copied from."""
    trainer = VLMGRPOTrainer(
        tiny_model(DEFAULT_FAMILY),
        lambda completions, solution, **kwargs: [
            1.0 if s in ("red", "green") else len(c[0]["content"])
            for c, s in zip(completions, solution, strict=True)
        ],
        args=grpo_args(
            tmp_path, dynamic_sampling=True, per_device_train_batch_size=6, num_generations=3, max_steps=3
        ),
        train_dataset=color_dataset(8),
    )
    reads: list[tuple[int, int]] = []  # (step, index)
    dataset = trainer.rollout.dataset

    class Reads:
        def __len__(self) -> int:
            return len(dataset)

        def __getitem__(self, index: int) -> dict:
            reads.append((trainer.state.global_step, index))
            return dataset[index]

    trainer.rollout.dataset = Reads()
    trainer.train()
    fresh = sum(e["dynamic_sampling/prompts"] for e in trainer.state.log_history if "loss" in e) - 2 * 3
    assert fresh > 0 and len(reads) >= fresh
    assert len(set(reads)) == len(reads), reads
