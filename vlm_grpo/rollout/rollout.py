"""`Rollout`: a generation batch's dataset rows in, its sampled rows out, behind one call the trainer makes per batch.

`Rollout.sample(inputs, mode, version)` loads the rows' images, draws and resets their environments, encodes each
distinct prompt once, samples one completion per row (transformers' `generate` with each group's prompt prefilled
once, or vLLM, or the user's `rollout_func`), decodes it, runs the tool loop, and with dynamic sampling replaces the
groups without signal by fresh ones. It returns a `RolloutBatch`: the rows trained on (`Sampled`), their image
inputs, what dynamic sampling dropped, and the metrics all of this produced.

What it shares with the training step is explicit: the policy's weights (the model it generates with, and the vLLM
engine it syncs when `version`, the optimizer steps taken, changes), the frozen vision's image features, which the
log-prob passes reuse, and the rewards, which it asks for through `score` only when dynamic sampling needs them
before the batch is trained.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from trl.data_utils import prepare_multimodal_messages
from trl.extras.profiling import ProfilingContext

from ..data.rows import load_rows, repeat_row, same_prompt
from ..errors import VLMGRPOError
from ..models import EncodedPrompt, ModelFamily
from ..policy.adapters import base_model
from ..policy.image_features import ImageFeatureCache
from ..policy.image_rows import ToolImageInputs, image_parts, row_image_inputs
from ..policy.sharing_plan import SharingPolicy, group_sizes
from ..runtime.monitoring import PhaseTimer
from .batch import Sampled, across_processes
from .dynamic_sampling import DynamicSampling, Round, chosen_logs, group_rows, kept_and_dropped
from .dynamic_sampling import metrics as dynamic_metrics
from .environments import draw_environments, reset_environments, tool_dicts, tool_metrics
from .generation import TransformersSampler
from .prompt_stream import PromptStream, prompt_key
from .rollout_func import call_rollout_func
from .tools import ToolBox, ToolLoop, history_prompts
from .vllm.generation import VLLMSampler

logger = logging.getLogger(__name__)

Score = Callable[[Sampled], tuple[torch.Tensor, dict[str, list], dict[str, list[float]]]]
"""`sampled -> (rewards [N, F] of every process's rows, log_extra columns, log_metric values)`: the trainer's rewards,
which dynamic sampling asks for before the batch is trained (every process calls it)."""


@dataclass(frozen=True)
class RolloutSettings:
    """What a run's rollout is fixed to.

    Attributes:
        num_generations (`int`): G in training.
        num_generations_eval (`int`): G in evaluation.
        max_completion_length (`int`): the completion budget, tool results included.
        chat_template_kwargs (`dict`): TRL's `chat_template_kwargs`.
        model_config (`PretrainedConfig`, *optional*): the policy's config (its context length).
        tool_chat_template (`str`, *optional*): with tools, TRL's training chat template.
        encode_features_after_sampling (`bool`): frozen vision under ZeRO-3 over several processes, with vLLM or tools:
            every row's image features are computed in one gathered context after sampling (see `_image_inputs`).
        report_to (`list[str]`): where TRL's profiling timings go.
    """

    num_generations: int
    num_generations_eval: int
    max_completion_length: int
    chat_template_kwargs: dict[str, Any]
    model_config: Any = None
    tool_chat_template: str | None = None
    encode_features_after_sampling: bool = False
    report_to: list[str] = field(default_factory=list)


@dataclass
class Tools:
    """A run's tools and environments, as TRL 1.16 sets them up in its `__init__`.

    Attributes:
        standalone (`list[Callable]`): tools given as `tools=`.
        factories (`dict`, *optional*): `{name: factory}` of `environment_factory` (`None` names a single one).
        pool (`dict`): `{name: [instances]}`, reused across batches.
        schemas (`dict`): `{name: tools}` each environment's rows render (standalone tools and its methods).
        multi_environment (`bool`): rows name their environment.
        loop (`ToolLoop`): runs the calls and the turns after them.
    """

    standalone: list[Callable]
    factories: dict[Any, Callable[[], Any]] | None
    pool: dict[Any, list[Any]]
    schemas: dict[Any, list[Callable]]
    multi_environment: bool
    loop: ToolLoop


@dataclass
class RolloutBatch:
    """A generation batch as sampled, ready for the training step.

    Attributes:
        sampled (`Sampled`): this process's rows to train on.
        image_inputs (`list[dict]`): each row's image and video inputs, the tools' images included.
        rewards (`torch.Tensor`, *optional*): `[N, F]` rewards of every process's rows, where dynamic sampling
            scored them already (None: the trainer scores them).
        reward_logs (`tuple[dict, dict]`, *optional*): with those rewards, what the reward functions logged for the
            rows trained on (`log_extra` columns, `log_metric` values).
        dropped (`tuple[Sampled, torch.Tensor]`, *optional*): dynamic sampling's unused groups and their rewards.
        metrics (`dict[str, float]`): `tools/*` and `dynamic_sampling/*`, over every process.
        seconds (`dict[str, float]`): seconds per phase (`gen`, `reward`).
    """

    sampled: Sampled
    image_inputs: list[dict[str, torch.Tensor]]
    rewards: torch.Tensor | None = None
    reward_logs: tuple[dict[str, list], dict[str, list[float]]] | None = None
    dropped: tuple[Sampled, torch.Tensor] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class Rollout:
    """Samples generation batches (see the module doc).

    Args:
        family (`ModelFamily`): the policy's family module.
        processor (`ProcessorMixin`): the family's processor.
        accelerator (`Accelerator`): the trainer's.
        settings (`RolloutSettings`): what the run's rollout is fixed to.
        sharing (`SharingPolicy`): whether generation prefills each group's prompt once.
        transformers (`TransformersSampler`): samples with `generate` where vLLM does not, and gathers the ZeRO-3
            model for the image features computed after sampling.
        vllm (`VLLMSampler`, *optional*): samples with vLLM.
        image_features (`ImageFeatureCache`, *optional*): frozen vision's features, kept for the batch's passes.
        tools (`Tools`, *optional*): the run's tools and environments.
        rollout_func (`Callable[[list], dict]`, *optional*): the user's `rollout_func`, the trainer bound to it.
        dynamic (`DynamicSampling`, *optional*): dynamic sampling's rounds.
        prompt_stream (`PromptStream`, *optional*): where its fresh prompts come from.
        dataset (`Dataset`, *optional*): the training dataset those prompts index.
        score (`Score`, *optional*): the trainer's rewards, for dynamic sampling.
    """

    def __init__(
        self,
        family: ModelFamily,
        processor: Any,
        accelerator: Accelerator,
        settings: RolloutSettings,
        sharing: SharingPolicy,
        transformers: TransformersSampler,
        vllm: VLLMSampler | None = None,
        image_features: ImageFeatureCache | None = None,
        tools: Tools | None = None,
        rollout_func: Callable[[list], dict[str, Any]] | None = None,
        dynamic: DynamicSampling | None = None,
        prompt_stream: PromptStream | None = None,
        dataset: Any = None,
        score: Score | None = None,
    ):
        self.family, self.processor, self.accelerator, self.settings = (
            family,
            processor,
            accelerator,
            settings,
        )
        self.sharing, self.transformers, self.vllm, self.image_features = (
            sharing,
            transformers,
            vllm,
            image_features,
        )
        self.tools, self.rollout_func = tools, rollout_func
        self.dynamic, self.prompt_stream, self.dataset, self.score = dynamic, prompt_stream, dataset, score
        self.version = 0  # the policy version the batch being sampled comes from
        self.tool_inputs: ToolImageInputs | None = None  # the batch being sampled's encoded tool images

    # ------------------------------------------------------------------------------------------ one batch
    def sample(
        self, inputs: list[dict[str, Any]], mode: str, version: int, clear_features: bool = True
    ) -> RolloutBatch:
        """Sample one generation batch (rows repeat each prompt G times); every process calls it together.

        Args:
            inputs (`list[dict]`): this process's dataset rows.
            mode (`str`): "train" or "eval".
            version (`int`): the policy's version (optimizer steps taken): the vLLM engine gets its weights when it
                holds another.
            clear_features (`bool`, *optional*, defaults to `True`): a training batch starts frozen vision's feature
                cache afresh (and dynamic sampling keeps the chosen rows' features only); asynchronous rollouts leave
                the cache to the trainer, whose passes of the batch before still read it.
        """
        self.version = version
        timer = PhaseTimer()
        self.tool_inputs = ToolImageInputs(self.family, self.processor, self.accelerator.device)
        if self.image_features is not None and mode == "train" and clear_features:
            self.image_features.clear()  # the previous generation batch's features are not needed any more
        if self.vllm is not None:
            self.vllm.sync(version, self.profile)
        sampled = self._sample_rows(inputs, mode, timer)
        batch = RolloutBatch(sampled, [])
        if mode == "train" and self.dynamic is not None:
            batch = self._refill(sampled, timer, clear_features)
        if self.tools is not None:
            batch.metrics.update(self._tool_metrics(batch.sampled))
        batch.image_inputs = self._image_inputs(batch.sampled)
        self.tool_inputs = None  # the batch holds the tensors it trains on
        batch.seconds = timer.pop()
        return batch

    def _sample_rows(self, inputs: list[dict[str, Any]], mode: str, timer: PhaseTimer) -> Sampled:
        """Encode each distinct prompt once, sample one completion per row, decode; then the tool loop."""
        rows = load_rows(inputs)
        inputs = list(inputs)
        names = environments = failures = None
        if self.tools is not None and self.tools.factories is not None:
            names, environments, failures = self._reset_environments(inputs, rows)
        schemas = self._schemas(len(inputs), names)
        with timer("gen"):
            encoded = self.encode_prompts(rows, schemas)
            shared = self.sharing.shares_generation(*self.shape(encoded, self.settings.max_completion_length))
            tool_mask = None
            if self.rollout_func is not None:  # with vLLM, it samples from the engine `sample` synced
                out = call_rollout_func(self.rollout_func, rows, inputs, encoded)
                inputs, encoded, completion_ids, tool_mask = (
                    out.inputs,
                    out.encoded,
                    out.completion_ids,
                    out.tool_mask,
                )
                logps = out.logprobs if self.vllm is not None else None
            else:
                completion_ids, logps = self._first_turn(rows, encoded, mode, shared, schemas)
        completions = self.family.decode_completions(
            self.processor, completion_ids, [e.input_ids for e in encoded], schemas
        )
        sampled = Sampled(
            inputs, encoded, completion_ids, logps, completions, shared, tool_mask,
            environments=environments, failures=failures,
        )  # fmt: skip
        if self.tools is not None:
            with timer("gen"):
                sampled = self._call_tools(rows, sampled, schemas, environments)
        return sampled

    def _first_turn(
        self,
        rows: list[dict[str, Any]],
        encoded: list[EncodedPrompt],
        mode: str,
        shared: bool,
        schemas: list[list] | None,
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """One completion per row, cut after its first eos; with vLLM also the sampled tokens' log-probs (each row's
        prompt rendered with its own tools, as the trainer encoded it)."""
        if self.vllm is not None:
            num_generations = (
                self.settings.num_generations if mode == "train" else self.settings.num_generations_eval
            )
            template = [self._template_kwargs(t) for t in schemas] if schemas else self._template_kwargs(None)
            return self.vllm.sample(rows, encoded, num_generations, template, self.profile)
        with self.profile("transformers.generate"):
            return self.transformers.sample(encoded, shared), None

    # ------------------------------------------------------------------------------------------ prompts
    def encode_prompts(
        self, rows: list[dict[str, Any]], schemas: list[list] | None = None
    ) -> list[EncodedPrompt]:
        """Chat template + processor once per distinct prompt: consecutive rows of one group share one encoding.

        Rows for which `same_prompt` holds get the same `EncodedPrompt` object; the shared-prefix passes and the vLLM
        payload find groups by that identity. Image tensors are moved to the device once. With tools, each prompt
        renders its row's tool definitions, with TRL's chat template (a prefix-preserving one where needed).
        """
        encoded: list[EncodedPrompt] = []
        for i, row in enumerate(rows):
            if i > 0 and same_prompt(row, rows[i - 1]) and (schemas is None or schemas[i] == schemas[i - 1]):
                encoded.append(encoded[-1])
                continue
            messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
            item = self.family.encode_prompt(
                self.processor, messages, row["images"], self._template_kwargs(schemas and schemas[i]),
                row["videos"],
            )  # fmt: skip
            self._check_context(item, row)
            item.image_inputs = {k: v.to(self.accelerator.device) for k, v in item.image_inputs.items()}
            encoded.append(item)
        return encoded

    def _template_kwargs(self, tools: list | None) -> dict[str, Any]:
        """`apply_chat_template`'s arguments for a prompt: TRL's `chat_template_kwargs`, and with tools, the tools and
        TRL's chat template (`tools=None` renders no tool section, as TRL passes `self.tools or None`)."""
        if self.tools is None:
            return self.settings.chat_template_kwargs
        return {
            **self.settings.chat_template_kwargs,
            "tools": tools or None,
            "chat_template": self.settings.tool_chat_template,
        }

    def _check_context(self, item: EncodedPrompt, row: dict[str, Any]) -> None:
        """A prompt plus its completion must fit the model's context; say why when its media make it too long."""
        config, budget = self.settings.model_config, self.settings.max_completion_length
        context = None if config is None else self.family.context_length(config)
        if context is None or len(item.input_ids) + budget <= context:
            return
        image_token_id = self.family.image_token_id(self.processor)
        image_tokens = sum(t == image_token_id for t in item.input_ids)
        if row["videos"]:
            media = f"its {len(row['videos'])} video(s) and {item.num_images} image(s)"
            fix = "Lower video_max_pixels, video_fps or video_max_frames, use shorter videos"
        else:
            media, fix = (
                f"{image_tokens} of them for its {item.num_images} image(s)",
                "Lower max_pixels (or max_tiles)",
            )
        raise VLMGRPOError(
            f"A prompt ({row['prompt']!r:.80}) has {len(item.input_ids)} tokens, {media}; with "
            f"max_completion_length {budget} it exceeds the model's context of {context} tokens. {fix}, use fewer "
            "media per prompt, or lower max_completion_length."
        )

    # ------------------------------------------------------------------------------------------ tools
    def _reset_environments(
        self, inputs: list[dict[str, Any]], rows: list[dict[str, Any]]
    ) -> tuple[list[Any], list[Any], list[str | None]]:
        """`(names, instances, failures)`: each row's environment drawn from the pool and reset, as TRL does (a
        `reset()` observation joins the row's prompt, in `rows` and `inputs`, for the rewards too); a `reset()` that
        raises fails its row only."""
        tools = self.tools
        names, environments = draw_environments(inputs, tools.factories, tools.pool, tools.multi_environment)
        prompts, failures = reset_environments(
            [r["prompt"] for r in rows], environments, inputs, tools.multi_environment
        )
        for i, prompt in enumerate(prompts):  # new dicts: the dataset's rows stay as they are, as in TRL
            rows[i] = {**rows[i], "prompt": prompt}
            inputs[i] = {**inputs[i], "prompt": prompt}
            if failures[i]:
                logger.warning(
                    f"Environment of row {i} ({names[i] or 'environment_factory'}, prompt {rows[i]['prompt']!r:.60}): "
                    f"{failures[i]}. The row is sampled but gets no reward, so it does not train."
                )
        return names, environments, failures

    def _schemas(self, rows: int, names: list[Any] | None) -> list[list] | None:
        """The tools each row's prompt renders (None without tools): its environment's, or the standalone tools."""
        if self.tools is None:
            return None
        if names is not None:
            return [self.tools.schemas[name] for name in names]
        return [self.tools.standalone] * rows

    def _call_tools(
        self,
        rows: list[dict[str, Any]],
        sampled: Sampled,
        schemas: list[list],
        environments: list[Any] | None,
    ) -> Sampled:
        """The tool loop over the first turn (see `tools.ToolLoop`); the next turns continue each group's prompt from
        one prefill where the first turn did (`SharingPolicy.shares_later_turns`)."""
        sync, asynchronous = tool_dicts(self.tools.standalone, environments, len(rows))
        toolbox = ToolBox(sync, asynchronous, schemas)
        prompts = [prepare_multimodal_messages(r["prompt"], images=r["images"]) for r in rows]
        images = [r["images"] or None for r in rows]
        turn_prompts = (
            [(e, r["images"]) for i, (e, r) in enumerate(zip(sampled.encoded, rows, strict=True))
             if i == 0 or e is not sampled.encoded[i - 1]]
            if self.sharing.shares_later_turns(sampled.shared_generation) else None
        )  # fmt: skip

        def generate(histories, images, has_tool_images, most_rows):
            if self.vllm is not None:
                return self.vllm.next_turns(histories, images, most_rows, self.profile)
            prompts = turn_prompts and history_prompts(histories, images, turn_prompts)
            # every process takes the same path, as ZeRO-3 counts the forward calls
            shares = turn_prompts is not None and bool(self.agree(prompts is not None, torch.all))
            with self.profile("transformers.generate"):
                return self.transformers.next_turns(
                    histories, images, prompts if shares else None, self.tool_inputs
                ), None

        turns = self.tools.loop.run(
            prompts, [e.input_ids for e in sampled.encoded], sampled.completion_ids, sampled.completions,
            sampled.sampling_logps, images, toolbox, generate, self._agreeing(torch.max),
        )  # fmt: skip
        unanswered = sum(bool(c[-1].get("tool_calls")) for c in turns.completions)
        if unanswered and self.accelerator.is_main_process:
            logger.info(
                f"{unanswered} of {len(rows)} completions end on a tool call without its result: the result would have "
                f"passed max_completion_length ({self.settings.max_completion_length}) or the model's context "
                "(rolled back, as TRL does), or max_tool_calling_iterations was reached."
            )
        return replace(
            sampled, completion_ids=turns.completion_ids, completions=turns.completions,
            sampling_logps=turns.logprobs, tool_mask=turns.tool_mask, tool_images=turns.tool_images,
            tool_calls=list(zip(turns.calls, turns.failures, turns.timeouts, strict=True)),
        )  # fmt: skip

    def _tool_metrics(self, sampled: Sampled) -> dict[str, float]:
        """`tools/*` over every process's rows trained on (with dynamic sampling, not the refill rounds')."""
        calls = [sum(c[k] for c in sampled.tool_calls) for k in range(3)] if sampled.tool_calls else [0, 0, 0]
        local = torch.tensor(
            [*calls, len(sampled.inputs)], dtype=torch.float32, device=self.accelerator.device
        )
        counts = self.accelerator.gather(local).view(-1, 4).sum(dim=0)  # calls, failures, timeouts, rows
        return tool_metrics(*counts.tolist())

    # ------------------------------------------------------------------------------------------ dynamic sampling
    def _refill(self, sampled: Sampled, timer: PhaseTimer, owns_features: bool) -> RolloutBatch:
        """Replace the groups whose advantages are all zero by groups of fresh prompts (see `dynamic_sampling`).

        The rows trained on come with their rewards; what the reward functions logged (`log_extra`, `log_metric`)
        is kept for those rows only.
        """
        process, num_generations = self.accelerator.process_index, self.settings.num_generations
        seen: set[str] = set()  # every process's prompts sampled in this generation batch

        def score(part: Sampled) -> Round:
            with timer("reward"):
                rewards, extra, logged = self.score(part)  # [N, F], every process
            seen.update(gather_object(sorted({prompt_key(x) for x in part.inputs})))
            n = len(part.inputs)
            return Round(part.inputs, part, rewards[process * n : (process + 1) * n], extra, logged)

        def fresh(groups: int) -> Round:
            read: dict[int, dict[str, Any]] = {}  # the rows `skip` read (images decoded), reused for sampling

            def skip(index: int) -> bool:
                read[index] = self.dataset[index]
                return prompt_key(read[index]) in seen

            indices = self.prompt_stream.take(groups * self.accelerator.num_processes, skip)
            mine = indices[process * groups : (process + 1) * groups]
            rows = [row for i in mine for row in repeat_row(read[i], num_generations)]
            return score(self._sample_rows(rows, "train", timer))

        least, most, total = (self._agreeing(reduce) for reduce in (torch.min, torch.max, torch.sum))
        collected = self.dynamic.collect(score(sampled), fresh, least, most)
        needed = len(sampled.inputs) // num_generations
        runs = group_rows(self.dynamic.chosen(collected, needed, least, total), num_generations)
        if collected.note and self.accelerator.is_main_process:
            logger.info(collected.note)
        metrics = dynamic_metrics(collected, lambda v: self.agree(float(v), torch.sum))
        chosen, local_rewards, dropped = kept_and_dropped(collected, runs, num_generations)
        if self.image_features is not None and owns_features:  # the dropped groups' image features go
            self.image_features.keep([e.image_inputs for e in chosen.encoded])
        rewards = self.accelerator.gather(local_rewards)  # [N, F], processes in order as TRL
        return RolloutBatch(chosen, [], rewards, chosen_logs(runs), dropped, metrics)

    # ------------------------------------------------------------------------------------------ helpers
    def _image_inputs(self, sampled: Sampled) -> list[dict[str, torch.Tensor]]:
        """Each row's image inputs: its prompt's, or with images its tools returned, the prompt's followed by the
        tools' (`policy.image_rows.ToolImageRow`).

        Frozen vision under ZeRO-3 over several processes, with vLLM or tools: the features of every row's images not
        stored yet (vLLM's prompts, the tools' images) are computed here, in one context where every process gathers
        the model together, so that no log-prob pass runs the vision tower on some processes only.
        """
        rows = [e.image_inputs for e in sampled.encoded]
        if any(sampled.tool_images or ()):
            rows = row_image_inputs(self.family, sampled.encoded, sampled.tool_images, self.tool_inputs)
        if self.settings.encode_features_after_sampling:
            sampler = self.transformers
            with sampler.generating(rows) as model:
                self.image_features.encode(base_model(self.accelerator, model), image_parts(rows))
        return rows

    def shape(self, encoded: list[EncodedPrompt], completion_len: int) -> tuple:
        """`(P, C, group sizes, agree)`: what `SharingPolicy` decides from; `agree` asks every process."""
        prompt_len = max(len(e.input_ids) for e in encoded)
        return (
            prompt_len,
            completion_len,
            group_sizes(encoded),
            lambda local: bool(self.agree(local, torch.all)),
        )

    def agree(self, value: float | bool, reduce: Callable[[torch.Tensor], torch.Tensor]) -> float:
        """`reduce` (`torch.min`, `max`, `sum`, `all`) of a number over every process; every process must call it."""
        return across_processes(self.accelerator, value, reduce)

    def _agreeing(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[int], int]:
        """`agree` of a count with `reduce`, as a function of the count."""
        return lambda count: int(self.agree(count, reduce))

    def profile(self, name: str) -> AbstractContextManager:
        """Times a block as TRL's profiling does (`VLMGRPOTrainer.<name>` to the run's trackers)."""
        return ProfilingContext(
            name=f"VLMGRPOTrainer.{name}", report_to=self.settings.report_to,
            is_main_process=self.accelerator.is_main_process, step=self.version,
        )  # fmt: skip
