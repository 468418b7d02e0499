"""The judge's backends: an OpenAI-compatible endpoint (`/v1/chat/completions`) or a causal LM loaded in the process.

Both take OpenAI chat messages and return one `Reply` per request: `complete_all` is awaited on the caller's event
loop (TRL's, for async rewards) while the requests run in the backend's threads. An endpoint's requests run
`concurrency` at a time, each with its timeout and bounded retries; a local model's run in batches of `batch_size`.
`connect()` reaches the judge once, before training, and raises a one-line `VLMGRPOError` naming it when it cannot.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import VLMGRPOError, one_line
from .judge_prompt import content_text

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"[\w-][\w.-]*/[\w.-]+")  # `owner/name`: a model the hub may hold
RETRIED_STATUS = 429  # retried although a 4xx: "too many requests" asks the client to come back later


@dataclass(frozen=True)
class Sampling:
    """How the judge samples its reply.

    Args:
        temperature (`float`, *optional*, defaults to 0.0): 0 is greedy decoding.
        max_tokens (`int`, *optional*, defaults to 256): the longest reply, in tokens.
    """

    temperature: float = 0.0
    max_tokens: int = 256


@dataclass(frozen=True)
class Reply:
    """What one request to the judge gave.

    Args:
        text (`str | None`): the reply; None when the request failed after its retries.
        latency (`float`): seconds from the first attempt to the answer (or to giving up).
        error (`str`, *optional*, defaults to `""`): why it failed.
    """

    text: str | None
    latency: float
    error: str = ""


class TransientError(Exception):
    """A failure worth retrying: no connection, a timeout, a 5xx status, a reply cut short."""


class RefusedError(Exception):
    """A failure a retry would repeat: a 4xx status, a body that is no chat completion."""


class EndpointJudge:
    """A judge served behind an OpenAI-compatible API (`vllm serve`, or a hosted one).

    Args:
        url (`str`): the API's base URL, e.g. `http://127.0.0.1:8000/v1`.
        model (`str`): the `model` field of each request (the name the server serves the judge under).
        api_key_env (`str | None`, *optional*, defaults to `None`): the environment variable holding the API key,
            read by `connect()`; None sends no key.
        sampling (`Sampling`, *optional*, defaults to `Sampling()`): temperature and max tokens.
        timeout (`float`, *optional*, defaults to 60.0): seconds per attempt.
        retries (`int`, *optional*, defaults to 2): further attempts after a transient failure.
        backoff (`float`, *optional*, defaults to 0.5): seconds before the first retry, doubled before each next.
        concurrency (`int`, *optional*, defaults to 16): requests in flight at most.
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key_env: str | None = None,
        sampling: Sampling = Sampling(),
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        concurrency: int = 16,
    ) -> None:
        self.url, self.model, self.api_key_env = url.rstrip("/"), model, api_key_env
        self.sampling, self.timeout, self.retries, self.backoff = sampling, timeout, retries, backoff
        self.concurrency = concurrency
        self._pool: ThreadPoolExecutor | None = None
        self._api_key: str | None = None

    @property
    def name(self) -> str:
        """How messages name this judge: `MODEL at URL`."""
        return f"{self.model} at {self.url}"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def connect(self) -> None:
        """Read the API key and list the served models (`GET {url}/models`), once.

        Raises:
            VLMGRPOError: the key's variable is unset, the endpoint cannot be reached or refuses the key, or it does
                not serve `model`.
        """
        if self.api_key_env is not None:
            self._api_key = os.environ.get(self.api_key_env)
            if not self._api_key:
                raise VLMGRPOError(
                    f"judge {self.name}: the environment variable {self.api_key_env} (api_key_env) is not set; "
                    "export the API key in it."
                )
        request = urllib.request.Request(f"{self.url}/models", headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                listed = json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise VLMGRPOError(
                f"judge {self.name}: GET {self.url}/models answered HTTP {error.code}; check the url and the API key."
            ) from error
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
            raise VLMGRPOError(
                f"judge {self.name}: cannot reach {self.url}/models ({one_line(error)}); start the judge's server "
                "or fix the url."
            ) from error
        except json.JSONDecodeError as error:
            raise VLMGRPOError(
                f"judge {self.name}: {self.url}/models is not an OpenAI-compatible API (its reply is not JSON); "
                "point url at the API's /v1."
            ) from error
        served = [m.get("id") for m in listed.get("data", []) if isinstance(m, dict)]
        if served and self.model not in served:
            raise VLMGRPOError(
                f"judge {self.name}: the server serves {', '.join(map(str, served))}, not {self.model!r}; "
                "set model to one of them."
            )

    def _attempt(self, body: bytes) -> str:
        """One POST to `/chat/completions`: the reply's text.

        Raises:
            TransientError: what a retry may fix.
            RefusedError: what it would not.
        """
        request = urllib.request.Request(f"{self.url}/chat/completions", data=body, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            if error.code >= 500 or error.code == RETRIED_STATUS:
                raise TransientError(f"HTTP {error.code}") from error
            raise RefusedError(f"HTTP {error.code}: {one_line(error)}") from error
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
            raise TransientError(f"{type(error).__name__}: {one_line(error)}") from error
        try:
            return json.loads(payload)["choices"][0]["message"]["content"] or ""
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as error:
            raise RefusedError(f"not a chat completion: {payload[:200]!r}") from error

    def complete(self, messages: list[dict[str, Any]]) -> Reply:
        """One request, retried after transient failures (with backoff); never raises for a failed request."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "temperature": self.sampling.temperature,
                "max_tokens": self.sampling.max_tokens,
            }
        ).encode()
        start, error = time.perf_counter(), ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return Reply(self._attempt(body), time.perf_counter() - start)
            except TransientError as failure:
                error = str(failure)
            except RefusedError as failure:
                return Reply(None, time.perf_counter() - start, str(failure))
        return Reply(None, time.perf_counter() - start, f"{error} after {self.retries + 1} attempts")

    async def complete_all(self, requests: list[list[dict[str, Any]]]) -> list[Reply]:
        """Every request, `concurrency` at a time, in the judge's threads; one `Reply` per request, in order."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="judge")
        loop = asyncio.get_running_loop()
        return list(
            await asyncio.gather(*(loop.run_in_executor(self._pool, self.complete, m) for m in requests))
        )


class LocalJudge:
    """A causal LM loaded in the training process with transformers, judging in batches. It reads text only: the
    images of a request are left out (serve a VLM judge behind an endpoint to send them).

    Args:
        path (`str`): the model folder (or hub id) `AutoModelForCausalLM` loads.
        sampling (`Sampling`, *optional*, defaults to `Sampling()`): temperature and max new tokens.
        batch_size (`int`, *optional*, defaults to 16): requests per `generate` call.
        device (`str | None`, *optional*, defaults to `None`): where the model runs; None: this process's
            accelerator (`cuda:LOCAL_RANK`), else the CPU.
    """

    def __init__(
        self, path: str, sampling: Sampling = Sampling(), batch_size: int = 16, device: str | None = None
    ) -> None:
        self.path, self.sampling, self.batch_size, self.device = path, sampling, batch_size, device
        self.model: Any = None
        self.tokenizer: Any = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def name(self) -> str:
        """How messages name this judge: its path."""
        return self.path

    def connect(self) -> None:
        """Load the tokenizer and the model, once.

        Raises:
            VLMGRPOError: the folder is missing or holds no causal LM transformers can load.
        """
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..device import accelerator_type

        if not Path(self.path).expanduser().is_dir() and _HUB_ID.fullmatch(self.path) is None:
            raise VLMGRPOError(f"judge {self.path}: no such model folder; point model_path at a saved model.")
        kind = accelerator_type()
        device = self.device or (f"{kind}:{os.environ.get('LOCAL_RANK', '0')}" if kind != "cpu" else "cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, padding_side="left")
            self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype="auto").to(device).eval()
        except (OSError, ValueError) as error:
            raise VLMGRPOError(
                f"judge {self.path}: cannot load it as a causal LM ({one_line(error)}); point model_path at a "
                "saved model folder."
            ) from error
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def prompt_text(self, messages: list[dict[str, Any]]) -> str:
        """The request as the model reads it: its chat template over the messages' text, or the text alone."""
        plain = [{"role": m["role"], "content": content_text(m["content"])} for m in messages]
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
        return "\n\n".join(m["content"] for m in plain)

    def generate(self, texts: list[str]) -> list[str]:
        """The replies to `texts` (prompts already rendered), `batch_size` at a time."""
        import torch

        replies: list[str] = []
        sampled = self.sampling.temperature > 0
        options = {"temperature": self.sampling.temperature} if sampled else {}
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]  # a chat template writes the special tokens itself
            special = not self.tokenizer.chat_template
            batch = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=special)
            batch = batch.to(self.model.device)
            with torch.inference_mode():
                out = self.model.generate(
                    **batch,
                    max_new_tokens=self.sampling.max_tokens,
                    do_sample=sampled,
                    pad_token_id=self.tokenizer.pad_token_id,
                    **options,
                )
            new = out[:, batch["input_ids"].shape[1] :]
            replies.extend(self.tokenizer.batch_decode(new, skip_special_tokens=True))
        return replies

    def _complete_batch(self, requests: list[list[dict[str, Any]]]) -> list[Reply]:
        start = time.perf_counter()
        texts = self.generate([self.prompt_text(m) for m in requests])
        latency = (time.perf_counter() - start) / max(len(texts), 1)
        return [Reply(text, latency) for text in texts]

    async def complete_all(self, requests: list[list[dict[str, Any]]]) -> list[Reply]:
        """Every request, batched, in the judge's thread (the event loop stays free for other async rewards)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._complete_batch, requests)
