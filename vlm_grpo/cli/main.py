"""`vlm-grpo`: one command, several subcommands; each forwards its arguments to its module's `main`.

vlm-grpo train CONFIG.yaml [--field value ...]    train (same as python -m vlm_grpo.train)
vlm-grpo eval --model PATH --data DATA.yaml      evaluate, write a JSON report
vlm-grpo demo [--output_dir DIR]                 a tiny VLM learns a task on CPU, end to end
vlm-grpo plan CONFIG.yaml [--gpus N]              will this recipe fit? per-GPU memory, predicted
vlm-grpo tiny-model FAMILY OUT_DIR               a tiny random model of a family, for a smoke run

Every command exits with status 1 on bad input (one line naming what and where), 0 on success.
"""

from __future__ import annotations

import sys
from importlib import import_module

from ..errors import EXIT_USER_ERROR, run_cli
from ..runtime.notices import quiet_third_party

COMMANDS = {
    "train": ("vlm_grpo.train", "train with GRPO from a YAML config"),
    "eval": ("vlm_grpo.cli.evaluate", "evaluate a model on a data config"),
    "demo": ("vlm_grpo.cli.demo", "train a tiny VLM on a synthetic task and evaluate it"),
    "plot": ("vlm_grpo.cli.plot", "plot reward, accuracy, length, KL and entropy of a run"),
    "samples": ("vlm_grpo.cli.samples", "render a run's logged samples as HTML"),
    "export": ("vlm_grpo.cli.export", "merge a LoRA adapter into its base model"),
    "plan": ("vlm_grpo.cli.plan", "predict a recipe's per-GPU memory before launching it"),
    "tiny-model": ("vlm_grpo.cli.tiny_model", "build a tiny random model of a family, for a smoke run"),
}


def usage() -> str:
    lines = ["usage: vlm-grpo COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Dispatch `vlm-grpo COMMAND ...` to the command's module.

    No command, or an unknown one, prints the usage and exits with status 1 (`EXIT_USER_ERROR`), as every bad
    input does; `-h`/`--help` prints it and exits with status 0.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return
    if not argv:
        print(usage(), file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vlm-grpo: error: unknown command {command!r}\n{usage()}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR)
    quiet_third_party()
    run_cli(command, import_module(COMMANDS[command][0]).main, rest)


if __name__ == "__main__":
    main()
