"""`judge`: a model scores each completion, behind an OpenAI-compatible endpoint or loaded in the process.

    rewards:
      - {name: judge, weight: 1.0, url: http://127.0.0.1:8000/v1, model: my-judge, api_key_env: JUDGE_API_KEY,
         template: "Question: {question}\\nReference: {solution}\\nAnswer: {completion}\\nScore 0-10:",
         parser: score, score_range: [0, 10]}

The template and its fields: `vlm_grpo.rewards.judge_prompt`; the parsers: `vlm_grpo.rewards.judge_parse`; the
backends, timeouts and retries: `vlm_grpo.rewards.judge_client`. Rows that ask the same thing (the same prompt,
completion and columns, as a group's identical completions do) are judged once per batch, and each reply is kept for
the run, so a request seen before is not sent again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import VLMGRPOError
from .judge_client import EndpointJudge, LocalJudge, Reply, Sampling
from .judge_parse import make_parser
from .judge_prompt import (
    NOT_COLUMNS,
    fill,
    image_url,
    messages_for,
    prompt_images,
    row_values,
    template_fields,
)

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Question: {question}\n\nReference answer: {solution}\n\nResponse: {completion}\n\n"
    "Rate how well the response answers the question, given the reference answer, from 0 (wrong) to 10 (fully "
    "correct). Reply with the number only."
)
"""The template a judge uses unless its spec gives one: a 0-10 score against the row's `solution`."""


class JudgeReward:
    """Registered as `judge`: a model's verdict on each completion, parsed to a reward in [0, 1].

    Each option is a key of the reward's spec in the YAML. Give either `url` and `model` (an endpoint) or
    `model_path` (a local model).

    Args:
        url (`str | None`, *optional*, defaults to `None`): base URL of an OpenAI-compatible API (`.../v1`).
        model (`str | None`, *optional*, defaults to `None`): the model name the endpoint serves the judge under.
        api_key_env (`str | None`, *optional*, defaults to `None`): the environment variable holding the
            endpoint's API key (never the key itself).
        model_path (`str | None`, *optional*, defaults to `None`): a causal LM loaded in the process instead (text
            only).
        template (`str`, *optional*, defaults to `DEFAULT_TEMPLATE`): the request's text (see
            `vlm_grpo.rewards.judge_prompt`).
        system (`str | None`, *optional*, defaults to `None`): a system message sent before it.
        parser (`str`, *optional*, defaults to `"score"`): `score`, `yes_no` or `rubric` (see
            `vlm_grpo.rewards.judge_parse`).
        score_range (`Sequence[float]`, *optional*, defaults to `(0, 10)`): `[low, high]` of a score or rubric
            item, rescaled to [0, 1].
        rubric (`Mapping[str, float] | None`, *optional*, defaults to `None`): `parser: rubric`'s items and
            weights.
        temperature (`float`, *optional*, defaults to 0.0): the judge's sampling temperature.
        max_tokens (`int`, *optional*, defaults to 256): the longest reply.
        timeout (`float`, *optional*, defaults to 60.0): seconds per request attempt.
        retries (`int`, *optional*, defaults to 2): further attempts after a connection error, a timeout or a 5xx.
        backoff (`float`, *optional*, defaults to 0.5): seconds before the first retry, doubled before each next.
        concurrency (`int`, *optional*, defaults to 16): requests in flight at most (endpoint).
        batch_size (`int`, *optional*, defaults to 16): requests per generate call (local model).
        device (`str | None`, *optional*, defaults to `None`): the local model's device; None: this process's
            accelerator.
        send_images (`bool`, *optional*, defaults to True): attach the row's images to the request.
        cache_size (`int`, *optional*, defaults to 65536): replies kept for the run (0: none kept).
    """

    def __init__(
        self,
        url: str | None = None,
        model: str | None = None,
        api_key_env: str | None = None,
        model_path: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        system: str | None = None,
        parser: str = "score",
        score_range: Sequence[float] = (0, 10),
        rubric: Mapping[str, float] | None = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        concurrency: int = 16,
        batch_size: int = 16,
        device: str | None = None,
        send_images: bool = True,
        cache_size: int = 65536,
    ) -> None:
        if (url is None) == (model_path is None):
            raise VLMGRPOError(
                "reward 'judge': give either url and model (an OpenAI-compatible endpoint) or model_path (a model "
                "loaded in the process)."
            )
        if url is not None and not model:
            raise VLMGRPOError(
                f"reward 'judge': url {url} needs model: the name the endpoint serves the judge under."
            )
        _check_numbers(float, temperature=(temperature, 0), timeout=(timeout, 1e-3), backoff=(backoff, 0))
        _check_numbers(
            int, max_tokens=(max_tokens, 1), retries=(retries, 0), concurrency=(concurrency, 1),
            batch_size=(batch_size, 1), cache_size=(cache_size, 0),
        )  # fmt: skip
        if not isinstance(template, str):
            raise VLMGRPOError(f"reward 'judge': template must be a string, got {type(template).__name__}.")
        self.fields = template_fields(template)
        self.template, self.system, self.send_images, self.cache_size = (
            template,
            system,
            send_images,
            cache_size,
        )
        self.parse: Callable[[str], float | None] = make_parser(parser, score_range, rubric)
        sampling = Sampling(float(temperature), int(max_tokens))
        self.backend: EndpointJudge | LocalJudge = (
            EndpointJudge(str(url), str(model), api_key_env, sampling, timeout, retries, backoff, concurrency)
            if url is not None
            else LocalJudge(str(model_path), sampling, batch_size, device)
        )
        self.connected = False
        self.cache: OrderedDict[str, str] = OrderedDict()

    def connect(self) -> None:
        """Reach the judge (list the endpoint's models, or load the local model), once per run.

        Raises:
            VLMGRPOError: one line naming the judge when it cannot be reached or loaded.
        """
        if not self.connected:
            self.backend.connect()
            self.connected = True

    def requests(
        self, prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Any]
    ) -> list[list[dict[str, Any]]]:
        """One request (chat messages) per row; an image shared by rows is encoded once."""
        size = len(completions)
        columns = {
            k: v
            for k, v in columns.items()
            if k not in NOT_COLUMNS and isinstance(v, list) and len(v) == size
        }
        encoded: dict[int, str] = {}
        requests = []
        for index in range(size):
            text = fill(self.template, row_values(index, prompts[index], completions[index], columns))
            images = []
            if self.send_images:
                images = columns["images"][index] if "images" in columns else prompt_images(prompts[index])
                images = [image for image in images or [] if image is not None]
            urls = [encoded.setdefault(id(image), image_url(image)) for image in images]
            requests.append(messages_for(text, urls, self.system))
        return requests

    async def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        reward_name: str = "judge",
        **columns: Any,
    ) -> list[float | None]:
        """The rewards of a batch, as TRL awaits an async reward; logs `{reward_name}/latency`, `/failures`,
        `/unparsed`, `/cache_hits` and `/requests`, and the replies as the column `{reward_name}_reply`."""
        if not self.connected:
            await asyncio.get_running_loop().run_in_executor(None, self.connect)
        requests = self.requests(prompts, completions, columns)
        keys = [_digest(request) for request in requests]
        pending = {key: request for key, request in zip(keys, requests) if key not in self.cache}
        replies = dict(zip(pending, await self.backend.complete_all(list(pending.values()))))
        texts = [self.cache[key] if key in self.cache else replies[key].text for key in keys]
        self._remember(replies)
        rewards = [None if text is None else self.parse(text) for text in texts]
        counts = {
            "failures": sum(text is None for text in texts),
            "unparsed": sum(text is not None and reward is None for text, reward in zip(texts, rewards)),
            "cache_hits": len(keys) - len(pending),
            "requests": len(pending),
        }
        _report(self.backend.name, list(replies.values()), texts, rewards)
        if log_metric is not None:
            if replies:
                log_metric(f"{reward_name}/latency", sum(r.latency for r in replies.values()) / len(replies))
            for name, count in counts.items():
                log_metric(f"{reward_name}/{name}", float(count))
        if log_extra is not None:
            log_extra(f"{reward_name}_reply", texts)
        return rewards

    def _remember(self, replies: Mapping[str, Reply]) -> None:
        """Keep the replies (not the failures) for the run, the oldest dropped beyond `cache_size`."""
        for key, reply in replies.items():
            if reply.text is not None and self.cache_size:
                self.cache[key] = reply.text
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)


def _digest(request: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def _report(judge: str, replies: list[Reply], texts: list[str | None], rewards: list[float | None]) -> None:
    """A warning for the batch's failed requests and unparsed replies, with the first of each."""
    failed = [r.error for r in replies if r.text is None]
    if failed:
        logger.warning("judge %s: %d of %d requests failed (%s)", judge, len(failed), len(replies), failed[0])
    unparsed = [t for t, r in zip(texts, rewards) if t is not None and r is None]
    if unparsed:
        logger.warning("judge %s: %d replies did not parse, e.g. %r", judge, len(unparsed), unparsed[0][:200])


def _check_numbers(kind: type, **values: tuple[Any, float]) -> None:
    """Refuse an option that is not a finite number of `kind` (`int`, or `float`, which takes an `int` too) at least
    its minimum."""
    for name, (value, least) in values.items():
        accepted = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, accepted) or not math.isfinite(value):
            raise VLMGRPOError(
                f"reward 'judge': {name} must be {'an integer' if kind is int else 'a number'}, got {value!r}."
            )
        if value < least:
            raise VLMGRPOError(f"reward 'judge': {name} must be at least {least}, got {value!r}.")
