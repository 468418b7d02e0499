"""A warning when a run cannot learn: every group's completions scored alike for many rollouts in a row.

GRPO learns from differences within a group: when the G completions of every prompt get the same reward, every
advantage is 0, the loss and its gradient are 0, and training goes on without moving. That happens with one's own
data on a fresh model when it never produces the format a reward expects, or when a reward ignores the completion.
`SignalWatch` counts such rollouts and says so once `no_signal_warning_steps` of them come in a row, then every
`no_signal_warning_every` rollouts while it lasts. With tools, when no completion of those rollouts called a tool,
the warning says so: a model that never calls a tool is never rewarded for a call, and a warm start on a few
conversations that call it gives GRPO its first calls (docs/tools.md#a-model-that-never-calls-a-tool-warm-start).
"""

from __future__ import annotations

import math


class SignalWatch:
    """Consecutive rollouts without a learning signal, and the warning they call for.

    Args:
        steps (`int`): rollouts in a row before the first warning; 0 turns the warning off.
        every (`int`): rollouts between repeated warnings while it lasts.
        samples_hint (`str`): where the user can read the completions (e.g. the samples folder).
    """

    def __init__(self, steps: int, every: int, samples_hint: str):
        self.steps, self.every, self.samples_hint = steps, every, samples_hint
        self.run = 0
        # tool calls per completion, summed over the rollouts without signal in a row; None: no tools
        self.calls: float | None = 0.0

    def observe(
        self,
        frac_zero_std: float,
        mean_reward: float,
        all_zero: bool,
        step: int,
        tool_call_frequency: float | None = None,
    ) -> str | None:
        """Record one rollout; return the warning when one is due.

        Args:
            frac_zero_std (`float`): share of groups whose rewards have zero spread (all processes).
            mean_reward (`float`): mean reward of the rollout.
            all_zero (`bool`): every reward of the rollout was 0.
            step (`int`): the optimizer step the rollout feeds, for the message.
            tool_call_frequency (`float | None`, *optional*, defaults to `None`): tool calls per completion in the
                rollout (TRL's `tools/call_frequency`); `None` when the run has no tools. When it is 0 on every
                rollout of the run without signal, the warning says that no completion called a tool.
        """
        if frac_zero_std < 1.0 and not all_zero:
            self.run, self.calls = 0, 0.0
            return None
        self.run += 1
        if tool_call_frequency is None or self.calls is None:
            self.calls = None
        else:
            self.calls += tool_call_frequency
        due = self.run == self.steps or (self.run > self.steps and (self.run - self.steps) % self.every == 0)
        if not self.steps or not due:
            return None
        seen = (
            "every reward was 0"
            if all_zero
            else "every group's completions got the same reward"
            + ("" if math.isnan(mean_reward) else f" (mean {mean_reward:.3g})")
        )
        if self.calls == 0:  # tools on, and not one call in the rollouts without signal
            cause = (
                "No completion called a tool in these rollouts: a model that never calls a tool is never rewarded "
                "for a call. Warm-start it on a few conversations that call the tool "
                "(docs/tools.md#a-model-that-never-calls-a-tool-warm-start)."
            )
        else:
            cause = (
                "Likely causes: the model never produces the format a reward expects (try a warm start or a more "
                "lenient format), or a reward ignores the completion."
            )
        return (
            f"No learning signal for {self.run} rollouts in a row (up to step {step}): {seen}, so every advantage "
            f"and the loss are 0 and the model does not change. {cause} Read the completions in {self.samples_hint}."
        )
