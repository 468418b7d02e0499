"""A warning when a run cannot learn: every group's completions scored alike for many rollouts in a row.

GRPO learns from differences within a group: when the G completions of every prompt get the same reward, every
advantage is 0, the loss and its gradient are 0, and training goes on without moving. That happens with one's own
data on a fresh model when it never produces the format a reward expects, or when a reward ignores the completion.
`SignalWatch` counts such rollouts and says so once `no_signal_warning_steps` of them come in a row, then every
`no_signal_warning_every` rollouts while it lasts.
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

    def observe(self, frac_zero_std: float, mean_reward: float, all_zero: bool, step: int) -> str | None:
        """Record one rollout; return the warning when one is due.

        Args:
            frac_zero_std (`float`): share of groups whose rewards have zero spread (all processes).
            mean_reward (`float`): mean reward of the rollout.
            all_zero (`bool`): every reward of the rollout was 0.
            step (`int`): the optimizer step the rollout feeds, for the message.
        """
        if frac_zero_std < 1.0 and not all_zero:
            self.run = 0
            return None
        self.run += 1
        due = self.run == self.steps or (self.run > self.steps and (self.run - self.steps) % self.every == 0)
        if not self.steps or not due:
            return None
        seen = (
            "every reward was 0"
            if all_zero
            else "every group's completions got the same reward"
            + ("" if math.isnan(mean_reward) else f" (mean {mean_reward:.3g})")
        )
        return (
            f"No learning signal for {self.run} rollouts in a row (up to step {step}): {seen}, so every advantage "
            "and the loss are 0 and the model does not change. Likely causes: the model never produces the format "
            "a reward expects (try a warm start or a more lenient format), or a reward ignores the completion. "
            f"Read the completions in {self.samples_hint}."
        )
