"""What the passes over a generation batch allocate: activations, the shared prompt's cache, the LM head's tiles.

A pass over `B` rows (`U` groups of the same prompt) of `P` prompt and `C` completion tokens runs full rows (one
forward of `B x (P+C)` tokens) or shares each group's prompt (`shared_prefix`: the prompt's first `P-1` tokens once
per group with `use_cache=True`, the cache indexed to the `B` rows, then `B x (C+1)` tokens that attend over it).
A shared pass holds the indexed cache (`B x P` tokens of KV cache) and, in each layer, the completion rows'
attention over the prompt's keys and values repeated to every head (`TokenCosts.attention_kv` per prompt token);
under gradient checkpointing, the recorded cache of the `U` prompts stays alive for the backward replay too.

- training (the policy's forward and backward): every layer's saved tensors, or with gradient checkpointing each
  layer's input plus one layer recomputed in backward;
- scoring (old and reference log-probs, no gradient, checkpointing off): one layer's tensors at a time;
- prefill of generation: one layer's tensors at a time over the prompts (`U` or `B` rows).
One layer's tensors at a time are bounded by what autograd saves for one layer (`TokenCosts.saved / layers`) plus
the residual stream (`layer_input`). The LM head is TRL's chunked log-prob kernel: a `[min(N, 4096), 32768]` tile
of logits (float32 with `cast_lm_head_to_fp32`), a copy of the scored hidden states and, in training, their float32
gradients and, when the head trains, a float32 gradient of its weight.
"""

from __future__ import annotations

from .measure import ParameterCounts, TokenCosts
from .plan import Recipe, Term

LM_HEAD_TILE = (4096, 32768)  # TRL's chunked log-prob tile: tokens x vocabulary columns


def groups_in(recipe: Recipe) -> int:
    """Groups of the same prompt in one training micro-batch (whole groups when a pass shares)."""
    return max(1, recipe.rows // recipe.num_generations)


def _layer(costs: TokenCosts) -> int:
    """Bytes per token of one layer's forward without a graph: one layer's saved tensors and the residual."""
    return costs.saved // costs.layers + costs.layer_input


def _scored(recipe: Recipe, shared: bool) -> int:
    """Positions TRL's LM head projects: the completions on CUDA (Triton), every position it is given elsewhere."""
    rows, prompt, completion = recipe.rows, recipe.prompt_tokens, recipe.completion_tokens
    if not recipe.scores_every_position:
        return rows * completion
    return rows * (completion + 1) if shared else rows * (prompt + completion)


def lm_head(recipe: Recipe, params: ParameterCounts, costs: TokenCosts, shared: bool, grad: bool) -> Term:
    """The LM-head log-prob term of a training (`grad`) or scoring pass."""
    scored = _scored(recipe, shared)
    fp32 = recipe.cast_lm_head_to_fp32
    tile = min(scored, LM_HEAD_TILE[0]) * LM_HEAD_TILE[1] * (4 if fp32 else recipe.weight_bytes)
    hidden = scored * costs.hidden_size * (recipe.weight_bytes + 4 * fp32 + 4 * grad)  # copies, fp32 gradient
    weight = costs.vocab_size * costs.hidden_size * 4 if grad and params.lm_head_trainable else 0
    parts = (
        ["tile", "scored hidden states"]
        + ["their fp32 gradients"] * grad
        + ["head's fp32 gradient"] * bool(weight)
    )
    note = f"TRL's chunked log-probs ({scored} positions): {', '.join(parts)}"
    return Term("LM-head log-probs", tile + hidden + weight, note=note)


def training_terms(recipe: Recipe, params: ParameterCounts, costs: TokenCosts, shared: bool) -> list[Term]:
    """What the policy's training forward keeps for backward (and the shared prompt's cache), the layer that
    gradient checkpointing recomputes, and the LM head."""
    rows, groups = recipe.rows, groups_in(recipe)
    prompt, completion = recipe.prompt_tokens, recipe.completion_tokens
    per_layer = costs.saved // costs.layers
    checkpointing = recipe.gradient_checkpointing
    kept = costs.layer_input * costs.layers if checkpointing else costs.saved
    how = "each layer's input" if checkpointing else "every layer's saved tensors"
    if shared:
        first, second = groups * (prompt - 1), rows * (completion + 1)
        attention = (
            rows * prompt * costs.attention_kv
        )  # completion rows attending over the prompt's keys/values
        cached = rows + (groups if checkpointing else 0)
        size = (first + second) * kept + cached * prompt * costs.cache + (0 if checkpointing else attention)
        recomputed = max(first * per_layer, second * per_layer + attention // costs.layers)
        note = f"shared: {groups} x {prompt - 1} prompt + {rows} x {completion + 1} tokens, {cached} x {prompt} cached"
    else:
        tokens = rows * (prompt + completion)
        size, recomputed = tokens * kept, tokens * per_layer
        note = f"full rows: {rows} x {prompt + completion} tokens"
    terms = [Term("activations", size, note=f"{note}; {how}")]
    if checkpointing:
        rebuilt = "one layer's saved tensors, rebuilt in backward"
        terms.append(Term("recomputed layer", recomputed, note=rebuilt))
    return [*terms, lm_head(recipe, params, costs, shared, grad=True)]


def scoring_terms(recipe: Recipe, params: ParameterCounts, costs: TokenCosts, shared: bool) -> list[Term]:
    """A no-gradient log-prob pass over one micro-batch (old or reference log-probs)."""
    rows, groups = recipe.rows, groups_in(recipe)
    prompt, completion = recipe.prompt_tokens, recipe.completion_tokens
    if shared:
        cache = rows * prompt * costs.cache
        second = rows * (completion + 1) * _layer(costs) + rows * prompt * costs.attention_kv // costs.layers
        size = cache + max(groups * (prompt - 1) * _layer(costs), second)
        note = f"shared: {rows} x {prompt} cached, one layer at a time"
    else:
        size = rows * (prompt + completion) * _layer(costs)
        note = f"full rows: {rows} x {prompt + completion} tokens, one layer at a time"
    forward = Term("forward (no gradient)", size, note=note)
    return [forward, lm_head(recipe, params, costs, shared, grad=False)]


def generation_terms(recipe: Recipe, costs: TokenCosts, shared: bool) -> list[Term]:
    """transformers' `generate`: the KV cache of the rows generated at once (with `fast_generation`, a static cache
    of whole buckets of tokens), and the larger of the prompts' prefill (one layer at a time) and the sampling
    logits."""
    rows, prompt, completion = recipe.generation_rows, recipe.prompt_tokens, recipe.completion_tokens
    static = recipe.fast_generation_decision.max_cache_len(prompt, completion)
    length = static or prompt + completion
    prefilled = (
        -(-rows // recipe.num_generations) if shared else rows
    )  # each group's prompt once, or every row's
    prefill = prefilled * prompt * _layer(costs)
    logits = rows * costs.vocab_size * 4 * 2  # last-token logits and probabilities, float32
    cache = Term(
        "KV cache",
        rows * length * costs.cache,
        note=f"{rows} rows x {length} tokens" + (" (static cache)" if static else ""),
    )
    larger = f"prefill of {prefilled} prompt row(s)" if prefill > logits else "sampling logits"
    return [cache, Term("prefill / sampling", max(prefill, logits), note=f"the larger: {larger}")]
