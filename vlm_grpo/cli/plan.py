"""`vlm-grpo plan`: will this recipe fit? Per-GPU memory predicted from the training config, before any launch.

    vlm-grpo plan recipes/qwen2_5_vl_7b_brand_qlora.yaml --gpus 1 --gpu_memory 24GiB
    vlm-grpo plan recipes/qwen2_5_vl_3b_rec.yaml --gpus 8 --deepspeed local_scripts/zero3.json
    vlm-grpo plan my.yaml --model_config path/to/config.json --image_size 896x672 --per_device_train_batch_size 2
    vlm-grpo plan my_video.yaml --images 0 --videos 1 --video_frames 16 --video_size 448x448

Any training option may be given on the command line, as with `vlm-grpo train`. The model's architecture comes
from its folder's `config.json`, `--model_config`, or the published config of a known checkpoint (no download);
it is built on the meta device, so nothing is allocated. How each term is counted: `vlm_grpo.planner.memory`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from ..errors import VLMGRPOError, run_cli

GIB = 2**30

USAGE = "vlm-grpo plan CONFIG.yaml [--gpus N] [--nodes M] [--gpu_memory 24GiB] [--option value ...]"


def plan_parser() -> argparse.ArgumentParser:
    """The planner's own options; every other flag is a training option."""
    parser = argparse.ArgumentParser(
        prog="vlm-grpo plan",
        usage=USAGE,
        description=__doc__.split("\n")[0],
        epilog="Any other --option is a training option, as in `vlm-grpo train --help`. How each term is counted: "
        "docs/planner.md.",
    )
    parser.add_argument("config", help="training YAML (as for vlm-grpo train)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node (default 1)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument(
        "--gpu_memory", default="24GiB", help="memory of one GPU, e.g. 24GiB, 80GB (default 24GiB)"
    )
    parser.add_argument(
        "--model_config", help="the model's config.json, when model_name_or_path is not local"
    )
    parser.add_argument(
        "--image_size",
        default=None,
        help="WIDTHxHEIGHT of the images (default: the square of max_pixels when the config sets it, else 448x448)",
    )
    parser.add_argument("--images", type=int, default=1, help="images per prompt (default 1)")
    parser.add_argument("--videos", type=int, default=0, help="videos per prompt (default 0)")
    parser.add_argument(
        "--video_frames",
        type=int,
        default=16,
        help="frames sampled from each video, e.g. video_fps x seconds (default 16; at most video_max_frames)",
    )
    parser.add_argument(
        "--video_size", default="448x448", help="WIDTHxHEIGHT of the video frames (default 448x448)"
    )
    parser.add_argument("--text_tokens", type=int, default=64, help="text tokens of a prompt (default 64)")
    parser.add_argument("--deepspeed", help="DeepSpeed json (ZeRO stage, offload); also read from the YAML")
    return parser


def parse_memory(text: str) -> int:
    """`"24GiB"` / `"80GB"` / `"24"` (GiB) in bytes; anything else is a one-line error."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(GiB|GB|G)?\s*", text)
    if match is None:
        raise VLMGRPOError(f"--gpu_memory {text!r}: give a size such as 24GiB or 80GB.")
    value, unit = float(match.group(1)), match.group(2) or "GiB"
    return int(value * (1e9 if unit == "GB" else GIB))


def parse_image_size(text: str, flag: str = "--image_size") -> tuple[int, int]:
    """`"448x448"` as `(width, height)`; `flag` names the option in the error."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None:
        raise VLMGRPOError(f"{flag} {text!r}: give WIDTHxHEIGHT, e.g. 448x448.")
    return int(match.group(1)), int(match.group(2))


def read_deepspeed(path: str | None) -> tuple[int, bool, bool]:
    """`(stage, offload_optimizer, offload_params)` of a DeepSpeed json; `(0, False, False)` without one."""
    if path is None:
        return 0, False, False
    if not Path(path).is_file():
        raise VLMGRPOError(f"deepspeed config {path} not found; give the path of a DeepSpeed json.")
    try:
        zero = json.loads(Path(path).read_text(encoding="utf-8")).get("zero_optimization", {})
    except json.JSONDecodeError as error:
        raise VLMGRPOError(f"{path}: not valid JSON ({error.msg}, line {error.lineno}).") from error
    offloaded = [
        zero.get(key, {}).get("device", "none") not in ("none", None)
        for key in ("offload_optimizer", "offload_param")
    ]
    return int(zero.get("stage", 0)), offloaded[0], offloaded[1]


def training_options(config_path: str, config: dict[str, Any], rest: list[str]) -> tuple[Any, Any]:
    """`(training_args, model_args)` parsed from the YAML and flags by `vlm-grpo train`'s parser."""
    from .options import build_parser, check_config_keys, check_flags, parser_options

    parser = build_parser()
    options = parser_options(parser)
    check_flags(rest, options["flags"])
    check_config_keys(config, config_path, options["names"])
    defaults = {k: v for k, v in config.items() if k not in ("deepspeed", "env")}
    parser.set_defaults(**defaults)
    try:
        _, training_args, model_args = parser.parse_args_into_dataclasses(args=rest)
    except ValueError as error:
        raise VLMGRPOError(f"{config_path}: {error}".splitlines()[0]) from error
    if model_args.model_name_or_path is None:
        raise VLMGRPOError(f"{config_path}: set model_name_or_path (or pass --model_name_or_path).")
    return training_args, model_args


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo plan`: parse, build the model on meta, print the plan and the verdict."""
    from .option_help import read_options
    from .options import check_config_keys, check_flags, read_config

    plan_args, rest = plan_parser().parse_known_args(argv)
    if plan_args.gpus < 1 or plan_args.nodes < 1:
        raise VLMGRPOError(
            f"--gpus and --nodes must be at least 1, got {plan_args.gpus} and {plan_args.nodes}."
        )
    config = read_config(plan_args.config)
    options = read_options()
    if options is not None:  # unknown keys and flags, before TRL and transformers are imported
        check_flags(rest, options["flags"])
        check_config_keys(config, plan_args.config, options["names"])
    if plan_args.videos < 0 or plan_args.video_frames < 2:
        raise VLMGRPOError(
            f"--videos must be at least 0 and --video_frames at least 2, got {plan_args.videos} and "
            f"{plan_args.video_frames}."
        )
    gpu_memory = parse_memory(plan_args.gpu_memory)
    image_size = parse_image_size(plan_args.image_size) if plan_args.image_size else None
    video_size = parse_image_size(plan_args.video_size, "--video_size")
    stage, offload_optimizer, offload_params = read_deepspeed(plan_args.deepspeed or config.get("deepspeed"))
    training_args, model_args = training_options(plan_args.config, config, rest)
    processes = plan_args.gpus * plan_args.nodes
    if stage and processes == 1:
        print("note: ZeRO on one GPU divides nothing; give --gpus (and --nodes) as you will launch.")
    from ..planner.report import VideoShape, describe, plan_config

    videos = VideoShape(plan_args.videos, plan_args.video_frames, video_size) if plan_args.videos else None

    planned = plan_config(
        training_args,
        model_args,
        gpu_memory,
        processes=processes,
        deepspeed=(stage, offload_optimizer, offload_params),
        image_size=image_size,
        images=plan_args.images,
        text_tokens=plan_args.text_tokens,
        model_config=plan_args.model_config,
        advise=True,
        videos=videos,
    )
    gpus = f"{plan_args.nodes} x {plan_args.gpus}" if plan_args.nodes > 1 else f"{plan_args.gpus}"
    title = f"vlm-grpo plan {plan_args.config}: {gpus} GPU(s) of {gpu_memory / GIB:.0f} GiB"
    print(describe(planned, gpu_memory, processes, title, gpus_per_node=plan_args.gpus))


__all__ = ["main"]

if __name__ == "__main__":
    run_cli("plan", main)
