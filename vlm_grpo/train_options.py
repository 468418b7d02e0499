"""The names and help of every `vlm-grpo train` option, kept on disk so that a typo is refused in a second.

Building the option parser imports TRL, transformers and torch (several seconds). The first parse writes what it
found to the user's cache folder (`$XDG_CACHE_HOME/vlm_grpo`, else `~/.cache/vlm_grpo`); later commands read it back
to refuse an unknown key or flag, and to print `train --help`, before any heavy import. The file is named by the
installed versions of vlm-grpo, TRL and transformers and by a hash of the files that declare our options, so an
upgrade or an edit makes a new one. Nothing depends on the cache: without it (or if it cannot be written) every
check runs after the heavy import, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

_DECLARING_FILES = ("config.py", "train.py", "option_cache.py")

COMMON_OPTIONS = (
    "model_name_or_path", "data_config", "rewards", "eval_data_config", "output_dir", "dtype",
    "use_peft", "lora_r", "lora_alpha", "load_in_4bit",
    "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "max_completion_length", "temperature", "beta", "loss_type", "steps_per_generation",
    "num_iterations", "gradient_checkpointing", "bf16", "use_vllm", "vllm_mode", "deepspeed",
    "logging_steps", "save_steps", "report_to", "resume_from_checkpoint", "seed",
)  # fmt: skip
"""The options `train --help` shows after ours; `--help-all` shows every one."""


def cache_file() -> Path | None:
    """Where this installation's option list lives, or None when a version cannot be read."""
    try:
        versions = "-".join(version(name) for name in ("vlm-grpo", "trl", "transformers"))
    except PackageNotFoundError:
        return None
    here = Path(__file__).parent
    digest = hashlib.sha256(b"".join((here / name).read_bytes() for name in _DECLARING_FILES)).hexdigest()[
        :12
    ]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlm_grpo"
    return root / f"train-options-{versions}-{digest}.json"


def read_options() -> dict[str, Any] | None:
    """`{"names", "flags", "help", "own"}` as the last full parse saw them, or None.

    `names` are the YAML keys, `flags` the command-line option strings, `help` each name's help text and `own` the
    names of our own options, in `--help` order.
    """
    path = cache_file()
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_options(options: dict[str, Any]) -> None:
    """Store the option list of a full parse (quietly skipped where the cache folder cannot be written)."""
    path = cache_file()
    if path is None or path.is_file():
        return
    data = options
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data), encoding="utf-8")
        partial.replace(path)
    except OSError:
        return


def short_help(options: dict[str, Any], usage: str) -> str:
    """`train --help`: our options, then the common TRL and transformers ones, with their help."""
    lines = [f"usage: {usage}", "", "Train a vision-language model with GRPO. CONFIG.yaml gives a value to any option below;",
             "a flag on the command line overrides it. `vlm-grpo train --help-all` lists every option.", ""]  # fmt: skip
    common = [name for name in COMMON_OPTIONS if name not in options["own"]]
    for title, names in (
        ("vlm_grpo options", options["own"]),
        ("common TRL and transformers options", common),
    ):
        lines.append(f"{title}:")
        for name in names:
            text = " ".join(str(options["help"].get(name) or "").split())
            wrapped = textwrap.wrap(text, 110 - 35) or [""]
            lines.append(f"  --{name:<30} {wrapped[0]}")
            lines += [" " * 35 + more for more in wrapped[1:]]
        lines.append("")
    return "\n".join(lines)
