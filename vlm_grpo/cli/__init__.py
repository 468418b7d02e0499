"""The command line: `vlm-grpo COMMAND` (`main`), one module per command, and the option help they share.

`vlm-grpo train` runs `vlm_grpo.train`, which stays at the package's top level because launchers run it by module
path (`torchrun -m vlm_grpo.train`, `accelerate launch -m vlm_grpo.train`); the other commands live here.
"""

from .main import main

__all__ = ["main"]
