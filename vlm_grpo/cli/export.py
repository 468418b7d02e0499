"""`vlm-grpo export`: merge a LoRA adapter into its base model and save a plain model with its processor.

    vlm-grpo export --model Qwen/Qwen2.5-VL-3B-Instruct --adapter runs/lora --out runs/lora-merged
    vlm-grpo export --model base/ --adapter runs/lora --out merged/ --dtype bfloat16 --overwrite

The result loads with `AutoModelForImageTextToText.from_pretrained(out)` and `AutoProcessor.from_pretrained(out)`
(or `vlm-grpo eval --model out`), with no PEFT needed. The base is loaded in full precision (`--dtype`, default
float32), never quantized, so the merge is exact even for an adapter trained with QLoRA.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..errors import VLMGRPOError, run_cli

logger = logging.getLogger("vlm_grpo")

ADAPTER_CONFIG = "adapter_config.json"


def _check_paths(model: str, adapter: Path, out: Path, overwrite: bool) -> None:
    """Refuse a missing adapter, an output that is the base or the adapter, and a non-empty output."""
    if not adapter.is_dir():
        raise VLMGRPOError(
            f"adapter folder {adapter} does not exist; pass the output_dir of a LoRA training run."
        )
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise VLMGRPOError(
            f"{adapter} holds no {ADAPTER_CONFIG}, so it is not a PEFT adapter; pass the output_dir of a LoRA "
            "training run (or one of its checkpoint-* folders)."
        )
    resolved = out.resolve()
    if resolved == adapter.resolve() or (Path(model).exists() and resolved == Path(model).resolve()):
        raise VLMGRPOError(f"--out {out} is the base model or the adapter folder; choose a new folder.")
    if out.exists() and not out.is_dir():
        raise VLMGRPOError(f"--out {out} is a file; choose a folder.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise VLMGRPOError(f"--out {out} is not empty; choose an empty folder or pass --overwrite.")


def export_merged(
    model: str,
    adapter: str | Path,
    out: str | Path,
    dtype: str = "float32",
    overwrite: bool = False,
    trust_remote_code: bool = False,
) -> str:
    """Merge the LoRA `adapter` into the base `model` and save the merged model and the processor to `out`.

    Args:
        model (`str`): base model folder or hub id the adapter was trained on.
        adapter (`str | Path`): PEFT adapter folder (holds `adapter_config.json`).
        out (`str | Path`): folder to write; created if missing.
        dtype (`str`, defaults to `"float32"`): dtype the base is loaded, merged and saved in: `"float32"`,
            `"bfloat16"`, `"float16"` or `"auto"` (the checkpoint's own dtype).
        overwrite (`bool`, defaults to False): write into a non-empty `out` (files of the same name are
            replaced).
        trust_remote_code (`bool`, defaults to False): allow code shipped with the checkpoint to run.

    Returns:
        `str`: `out` as a string.

    Raises:
        VLMGRPOError: no adapter at `adapter`, `out` not empty without `overwrite`, `out` is the base or the
            adapter, or an unsupported `dtype`.
    """
    adapter, out = Path(adapter), Path(out)
    _check_paths(model, adapter, out, overwrite)  # before the heavy imports: named in a second
    from peft import PeftModel

    from ..models import get_model_family

    family = get_model_family(model, trust_remote_code=trust_remote_code)
    init_kwargs = family.model_init_kwargs(dtype=dtype, trust_remote_code=trust_remote_code)
    base = family.load_model(model, **init_kwargs)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    leftover = [name for name in merged.state_dict() if "lora_" in name]
    if leftover:
        raise RuntimeError(
            f"merging left adapter weights in the model (e.g. {leftover[0]}); nothing was saved."
        )
    processor = family.load_processor(model, trust_remote_code=trust_remote_code)

    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    processor.save_pretrained(out)
    logger.info("merged %s into %s and saved it to %s", adapter, model, out)
    return str(out)


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo export`; a bad path is a `VLMGRPOError` (one line, status 1)."""
    parser = argparse.ArgumentParser(prog="vlm-grpo export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="base model folder or hub id the adapter was trained on"
    )
    parser.add_argument("--adapter", required=True, help="LoRA adapter folder (holds adapter_config.json)")
    parser.add_argument("--out", required=True, help="folder to write the merged model and processor to")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16", "auto"],
        help="dtype to merge and save in (default float32)",
    )
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    parser.add_argument("--trust_remote_code", action="store_true")
    args = parser.parse_args(argv)
    out = export_merged(
        args.model, args.adapter, args.out, args.dtype, args.overwrite, args.trust_remote_code
    )
    print(out)


if __name__ == "__main__":
    run_cli("export", main, sys.argv[1:])
