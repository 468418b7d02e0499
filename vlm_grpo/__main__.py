"""`python -m vlm_grpo COMMAND ...` is the same as `vlm-grpo COMMAND ...`."""

from .cli.main import main

main()
