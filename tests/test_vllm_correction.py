"""vLLM importance-sampling correction: TRL 1.16's ratio, modes and bounds, and its `sampling/*` metrics."""

from __future__ import annotations

import math

import pytest
import torch

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.trainer.vllm_correction import MODES, importance_sampling_ratio, local_statistics

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]])  # [B=2, C=3]
SAMPLING = torch.tensor([[-1.5, -1.0, float("nan")], [-0.2, -0.5, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# old - sampling on completion tokens: [[0.5, -1.0, nan->0], [0.0, -2.5, masked->0]]
TOKEN = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, math.exp(-2.5), 1.0]])
SEQUENCE = torch.tensor([[math.exp(-0.5)], [math.exp(-2.5)]])


@pytest.mark.parametrize(
    "mode, clip_min, clip_max, expected",
    [
        ("token_truncate", None, 1.5, TOKEN.clamp(max=1.5)),
        ("token_truncate", 0.2, 3.0, TOKEN.clamp(0.2, 3.0)),
        ("token_mask", 0.2, 1.5, torch.tensor([[0.0, math.exp(-1.0), 1.0], [1.0, 0.0, 1.0]])),
        ("token_mask", None, None, TOKEN),
        ("sequence_truncate", 0.5, 3.0, SEQUENCE.clamp(0.5, 3.0)),
        ("sequence_mask", 0.5, None, torch.tensor([[math.exp(-0.5)], [0.0]])),
    ],
)
def test_ratio_matches_trl(mode, clip_min, clip_max, expected):
    ratio = importance_sampling_ratio(OLD, SAMPLING, MASK, mode, clip_min, clip_max)
    torch.testing.assert_close(ratio, expected)


def test_statistics_skip_unscored_and_masked_tokens():
    ratio = importance_sampling_ratio(OLD, SAMPLING, MASK, "token_truncate", None, 3.0)
    stats = local_statistics(OLD, SAMPLING, MASK, ratio, "token_truncate")
    assert stats["logp_difference/mean"].item() == pytest.approx((0.5 + 1.0 + 0.0 + 2.5) / 4)
    assert stats["logp_difference/max"].item() == pytest.approx(2.5)
    assert stats["importance_sampling_ratio/min"].item() == pytest.approx(math.exp(-2.5))
    assert stats["importance_sampling_ratio/max"].item() == pytest.approx(math.exp(0.5))
    assert stats["importance_sampling_ratio/mean"].item() == pytest.approx(ratio[MASK.bool()].mean().item())
    sequence = importance_sampling_ratio(OLD, SAMPLING, MASK, "sequence_mask", None, None)
    seq_stats = local_statistics(OLD, SAMPLING, MASK, sequence, "sequence_mask")
    assert seq_stats["importance_sampling_ratio/mean"].item() == pytest.approx(sequence.mean().item())


def test_unknown_mode_is_one_line():
    assert "token_mask" in MODES
    with pytest.raises(VLMGRPOError, match=r"^vllm_importance_sampling_mode must be one of .*'tokens'\.$"):
        importance_sampling_ratio(OLD, SAMPLING, MASK, "tokens", None, None)


def test_correction_is_accepted_with_vllm(tmp_path):
    from conftest import grpo_args

    args = grpo_args(tmp_path, use_vllm=True, vllm_importance_sampling_cap=2.0)
    assert args.vllm_importance_sampling_correction and args.vllm_importance_sampling_clip_max == 2.0
