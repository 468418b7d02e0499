"""Sampling with vLLM through TRL's backend, colocated or served: the prompts vLLM takes (`payload`), the weight sync
and the sampler (`generation`), and vLLM's CPU backend's plain linear weights (`cpu`)."""
