"""The `vlm-grpo` commands other than `train`, one module each.

`eval`, `demo`, `plot`, `samples`, `export`, `plan` and `tiny-model`. `vlm-grpo train` runs `vlm_grpo.train`, which
stays at the package's top level because launchers run it by module path (`torchrun -m vlm_grpo.train`,
`accelerate launch -m vlm_grpo.train`); `vlm_grpo.cli` dispatches them all.
"""
