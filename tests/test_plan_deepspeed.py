"""`vlm-grpo plan` under DeepSpeed: the model states against DeepSpeed's own estimators, and ZeRO-3's generation.

DeepSpeed 0.19.8's estimators (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`)
itemize the model states of a fully trainable model: ZeRO-2 `2P + 18P/N` on the GPU ("2 = params_16bit,
18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit"), ZeRO-3 `4L + 18P/N`, and with
offload `16P` or `18P` per node on the host. They are called here with `additional_buffer_factor=1` (their 1.5 is a
margin, not an allocation) and compared with the planner's model-state terms, less the buffers DeepSpeed's source
allocates that the estimators leave out (`LEFT_OUT`). The estimators' host figures without offload are the RAM
each process needs to load the checkpoint, which the planner does not plan, so they are not compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_plan import planned

from vlm_grpo.models import get_model_family
from vlm_grpo.testing import DEFAULT_FAMILY

LEFT_OUT = {
    # stage3.py: `grad_partitions_flat_buffer`, this process's gradients in the model dtype, allocated at
    # initialization (on the host with offload_optimizer), beside the float32 gradients the step converts them to
    "gradient partition",
    # stage_1_and_2.py: `param_buffer_of_bit16_for_cpu_offload_groups`, the bf16 copy of the updated partition
    "updated-weights copy",
    # stage_1_and_2.py: `temp_grad_buffer_for_gpu_offload` / `temp_grad_buffer_for_cpu_offload`, a largest parameter
    "offload gradient buffers",
    "offload gradient buffers (host)",
}
ROOT = Path(__file__).parents[1]
GPUS = 4  # one node; the ZeRO-2 offload estimator takes the larger of 16P and 4P per GPU for loading


def estimator_view(plan, processes: int) -> tuple[int, int]:
    """`(GPU bytes, host bytes per node)` of the planner's model states, less what the estimators leave out."""
    states = [t for t in plan.terms() if t.state and t.name not in LEFT_OUT]
    return sum(t.gpu for t in states), processes * sum(t.host for t in states)


@pytest.fixture(scope="module")
def fully_trainable(tiny_model):
    """A tiny model's path, and `(total, largest module)` parameters as DeepSpeed's `model_to_params` counts them."""
    from deepspeed.runtime.zero.stage3 import model_to_params

    path = tiny_model(DEFAULT_FAMILY)
    real = get_model_family(path).load_model(path, dtype=torch.bfloat16)
    return path, model_to_params(real)


def plan_zero(path: str, stage: int, offload_optimizer: bool = False, offload_params: bool = False):
    deepspeed = (stage, offload_optimizer, offload_params)
    options = dict(processes=GPUS, deepspeed=deepspeed)
    return planned(path, dtype="bfloat16", optim="adamw_torch", beta=0.0, plan_options=options).plan


@pytest.mark.parametrize("offload", [False, True])
def test_zero2_model_states_match_deepspeeds_estimator(fully_trainable, offload):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    path, (total, _) = fully_trainable
    host, gpu = estimate_zero2_model_states_mem_needs(total, GPUS, 1, offload, additional_buffer_factor=1.0)
    planned_gpu, planned_host = estimator_view(plan_zero(path, 2, offload), GPUS)
    assert planned_gpu == pytest.approx(gpu, rel=0.05)
    if offload:
        assert planned_host == pytest.approx(host, rel=0.05)


@pytest.mark.parametrize("offload", [False, True])
def test_zero1_keeps_every_gradient_whole_where_zero2_keeps_its_partition(fully_trainable, offload):
    """ZeRO-1 (`partition_grads` off in `DeepSpeedZeroOptimizer`) reduces the gradients only after backward
    (`reduce_gradients`): each process holds every gradient, `2P`, where ZeRO-2 holds its partition, `2P/N`;
    everything else is allocated as under ZeRO-2."""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    path, (total, _) = fully_trainable
    host, gpu = estimate_zero2_model_states_mem_needs(total, GPUS, 1, offload, additional_buffer_factor=1.0)
    whole_gradients = 2 * total - (0 if offload else 2 * total // GPUS)
    planned_gpu, planned_host = estimator_view(plan_zero(path, 1, offload), GPUS)
    assert planned_gpu == pytest.approx(gpu + whole_gradients, rel=0.05)
    if offload:
        assert planned_host == pytest.approx(host, rel=0.05)


@pytest.mark.parametrize(
    ("offload_optimizer", "offload_params"), [(False, False), (True, False), (True, True)]
)
def test_zero3_model_states_match_deepspeeds_estimator(fully_trainable, offload_optimizer, offload_params):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    path, (total, largest) = fully_trainable
    host, gpu, _ = estimate_zero3_model_states_mem_needs(
        total,
        largest,
        GPUS,
        1,
        offload_optimizer,
        offload_params,
        zero_init=True,
        additional_buffer_factor=1.0,
    )
    plan = plan_zero(path, 3, offload_optimizer, offload_params)
    planned_gpu, planned_host = estimator_view(plan, GPUS)
    assert planned_gpu == pytest.approx(gpu, rel=0.05)
    if offload_optimizer:
        assert planned_host == pytest.approx(host, rel=0.05)
    partition = next(t for t in plan.held if t.name == "gradient partition")
    assert partition.gpu + partition.host == 2 * total // GPUS  # the buffer the estimator leaves out


def test_zero3_offload_keeps_no_gradient_on_the_gpu(fully_trainable):
    """local_scripts/zero3_offload.json: the gradient partitions live on the host, the GPU only reduces them."""
    from vlm_grpo.cli.plan import read_deepspeed

    path, _ = fully_trainable
    deepspeed = read_deepspeed(str(ROOT / "local_scripts" / "zero3_offload.json"))
    plan = planned(path, dtype="bfloat16", plan_options=dict(processes=8, deepspeed=deepspeed)).plan
    gradients = [t for t in plan.terms() if "gradient" in t.name and t.state]
    assert gradients and all(t.gpu == 0 and t.host > 0 for t in gradients)


def test_zero3_generation_gathers_every_weight_unless_told_not_to(fully_trainable):
    """TRL wraps `generate` in `deepspeed.zero.GatheredParameters(model.parameters())` while
    `ds3_gather_for_generation` (on by default): every GPU then holds every weight."""
    from trl import GRPOConfig

    path, _ = fully_trainable
    real = get_model_family(path).load_model(path, dtype=torch.bfloat16)
    whole = sum(p.numel() * p.element_size() for p in real.parameters())
    options = dict(processes=8, deepspeed=(3, False, False))
    assert GRPOConfig.__dataclass_fields__["ds3_gather_for_generation"].default is True
    gathering = planned(path, dtype="bfloat16", plan_options=options).plan
    gathered = {t.name: t.gpu for t in gathering.generation}["ZeRO-3 gathered policy"]
    assert gathered == whole
    assert gathering.peak >= sum(t.gpu for t in gathering.held) + whole
    not_gathering = planned(
        path, dtype="bfloat16", ds3_gather_for_generation=False, plan_options=options
    ).plan
    generation = [sum(t.gpu for t in plan.generation) for plan in (gathering, not_gathering)]
    assert generation[0] - generation[1] == whole


def test_the_30b_recipe_cannot_gather_its_weights_on_80_gib(capsys, monkeypatch):
    from vlm_grpo.cli.plan import main

    monkeypatch.chdir(ROOT)
    main(
        ["recipes/qwen3_vl_30b_a3b_zero3.yaml", "--gpus", "8", "--gpu_memory", "80GiB",
         "--deepspeed", "local_scripts/zero3.json", "--ds3_gather_for_generation", "true"]
    )  # fmt: skip
    out = capsys.readouterr().out
    gathered = next(line for line in out.splitlines() if "ZeRO-3 gathered policy" in line)
    assert float(gathered.split()[3]) > 55  # 31.1B parameters x 2 bytes
    assert "verdict     does not fit in 80 GiB" in out
