"""`vlm-grpo tiny-model FAMILY OUT_DIR`: a tiny random model of a family, built offline, for a smoke run.

    vlm-grpo tiny-model qwen2_5_vl runs/tiny
    vlm-grpo train my_task.yaml --model_name_or_path runs/tiny --max_steps 4

The folder holds what `from_pretrained` loads (weights, config, generation config, tokenizer, processor and chat
template, as the family's published checkpoints lay them out), with a word-level vocabulary of common English
words, digits and punctuation, plus any `--words` of your task. A random model learns nothing useful: it shows
that data, rewards and options run end to end in seconds, before a real model is downloaded.
"""

from __future__ import annotations

import argparse

from ..errors import VLMGRPOError


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo tiny-model`."""
    from ..testing import TINY_FAMILIES, build_tiny_model

    parser = argparse.ArgumentParser(
        prog="vlm-grpo tiny-model",
        description=__doc__.split("\n\n")[0],
        epilog=f"families: {', '.join(TINY_FAMILIES)}",
    )
    parser.add_argument("family", metavar="FAMILY", help=f"one of: {', '.join(TINY_FAMILIES)}")
    parser.add_argument(
        "out_dir", metavar="OUT_DIR", help="folder to write (created; files in it are replaced)"
    )
    parser.add_argument("--words", nargs="+", default=[], help="extra vocabulary words (your task's answers)")
    parser.add_argument("--hidden_size", type=int, default=64, help="text hidden size, a multiple of 8")
    parser.add_argument("--num_hidden_layers", type=int, default=2, help="text and vision depth")
    parser.add_argument("--image_size", type=int, default=56, help="image side the processor resizes to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    if args.family not in TINY_FAMILIES:
        raise VLMGRPOError(f"unknown family {args.family!r}; choose one of: {', '.join(TINY_FAMILIES)}.")
    try:
        path = build_tiny_model(
            args.family, args.out_dir, words=args.words, seed=args.seed, hidden_size=args.hidden_size,
            num_hidden_layers=args.num_hidden_layers, image_size=args.image_size,
        )  # fmt: skip
    except ValueError as error:  # sizes the architecture cannot take, or a word with whitespace
        raise VLMGRPOError(f"tiny-model {args.family}: {error}") from error
    print(f"tiny {args.family} model written to {path}; train on it with --model_name_or_path {path}")
