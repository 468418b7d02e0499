"""`vlm-grpo tiny-model FAMILY OUT_DIR`: a tiny random model of a family, built offline, for a smoke run.

    vlm-grpo tiny-model qwen2_5_vl runs/tiny
    vlm-grpo train my_task.yaml --model_name_or_path runs/tiny --max_steps 4

The folder holds what `from_pretrained` loads (weights, config, generation config, tokenizer, processor and chat
template, as the family's published checkpoints lay them out), with a word-level vocabulary of common English
words, digits and punctuation, plus any `--words` of your task. A random model learns nothing useful: it shows
that data, rewards and options run end to end in seconds, before a real model is downloaded.

Every family has 4 attention heads, so the attention head dim is `--hidden_size / 4`. The default, 256, gives head
dim 64, which vLLM's CPU backend runs (its attention takes head dims 32, 64, 80, ..., and Qwen3.5's linear attention
64 or 128), so the same folder also serves a smoke run with `use_vllm: true` on a CPU.
"""

from __future__ import annotations

import argparse

from ..errors import VLMGRPOError

FAMILY_NAMES = (
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "gemma3", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "gemma4",
    "glm4v", "glm46v", "glm4v_moe", "internvl_moe",
)  # fmt: skip
"""`vlm_grpo.testing.TINY_FAMILIES`, listed here so that `--help` and a wrong name are answered before the builders
(and torch and transformers) are imported; a test keeps the two equal."""

NUM_HEADS = 4
"""Attention heads of every tiny family's text model."""
DEFAULT_HIDDEN_SIZE = 256
"""Text hidden size by default: attention head dim 64, one that vLLM's CPU backend runs."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo tiny-model`."""
    parser = argparse.ArgumentParser(
        prog="vlm-grpo tiny-model",
        description=__doc__.split("\n\n")[0],
        epilog=f"families: {', '.join(FAMILY_NAMES)}",
    )
    parser.add_argument("family", metavar="FAMILY", help=f"one of: {', '.join(FAMILY_NAMES)}")
    parser.add_argument(
        "out_dir", metavar="OUT_DIR", help="folder to write (created; files in it are replaced)"
    )
    parser.add_argument("--words", nargs="+", default=[], help="extra vocabulary words (your task's answers)")
    parser.add_argument(
        "--hidden_size",
        type=int,
        default=DEFAULT_HIDDEN_SIZE,
        help=f"text hidden size, a multiple of 8; {NUM_HEADS} attention heads, so head dim hidden_size / {NUM_HEADS} "
        f"(default {DEFAULT_HIDDEN_SIZE}: head dim {DEFAULT_HIDDEN_SIZE // NUM_HEADS}, which vLLM's CPU backend runs)",
    )
    parser.add_argument("--num_hidden_layers", type=int, default=2, help="text and vision depth")
    parser.add_argument("--image_size", type=int, default=56, help="image side the processor resizes to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    check_arguments(args)
    from ..testing import build_tiny_model  # torch and transformers: once the arguments are checked

    try:
        path = build_tiny_model(
            args.family, args.out_dir, words=args.words, seed=args.seed, hidden_size=args.hidden_size,
            num_hidden_layers=args.num_hidden_layers, image_size=args.image_size,
        )  # fmt: skip
    except ValueError as error:  # sizes the architecture cannot take, or a word with whitespace
        raise VLMGRPOError(f"tiny-model {args.family}: {error}") from error
    print(f"tiny {args.family} model written to {path}; train on it with --model_name_or_path {path}")
    note = vllm_cpu_note(path)
    if note:
        print(note)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before the builders are imported, a family, size or word that no builder takes (the builders check
    the same again).

    Raises:
        VLMGRPOError: an unknown family, a hidden size that is not a multiple of `2 * NUM_HEADS` of at least
            `4 * NUM_HEADS`, no layer, or a word with whitespace.
    """
    if args.family not in FAMILY_NAMES:
        raise VLMGRPOError(f"unknown family {args.family!r}; choose one of: {', '.join(FAMILY_NAMES)}.")
    if args.hidden_size % (2 * NUM_HEADS) or args.hidden_size < 4 * NUM_HEADS:
        raise VLMGRPOError(
            f"--hidden_size {args.hidden_size}: give a multiple of {2 * NUM_HEADS} of at least {4 * NUM_HEADS} "
            f"(default {DEFAULT_HIDDEN_SIZE})."
        )
    if args.num_hidden_layers < 1:
        raise VLMGRPOError(f"--num_hidden_layers {args.num_hidden_layers}: give at least 1.")
    spaced = [word for word in args.words if not word or word.split() != [word]]
    if spaced:
        raise VLMGRPOError(f"--words {spaced[0]!r}: a vocabulary word is one token, without whitespace.")


def vllm_cpu_note(path: str) -> str | None:
    """A note when vLLM's CPU backend cannot run the model in `path` (see `check_vllm_cpu_attention`), else None."""
    import torch
    from transformers import AutoConfig

    from ..models import get_model_family
    from ..rollout.vllm.payload import check_vllm_cpu_attention

    config = AutoConfig.from_pretrained(path)
    try:
        check_vllm_cpu_attention(get_model_family(config), config, torch.device("cpu"), path)
    except VLMGRPOError as error:
        return f"note: use_vllm: true on a CPU will refuse it: {error}"
    return None
