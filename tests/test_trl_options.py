"""Every field of TRL's `GRPOConfig` is classified: honoured (with the test that shows it) or rejected (with a message).

A field that a newer TRL adds fails `test_every_grpo_field_is_classified` until it is added to
`vlm_grpo/trl_options.py`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import transformers
import trl
from conftest import grpo_args

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.trl_options import GRPO_OPTIONS, TRAINING_ARGUMENTS, Honoured, Rejected, rejected_option_names

ROOT = Path(__file__).resolve().parent.parent
TRAINING_FIELDS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
GRPO_FIELDS = {f.name for f in dataclasses.fields(trl.GRPOConfig)} - TRAINING_FIELDS

# A value that triggers each rejection (every other value of these fields is TRL's default, which is accepted).
REJECTING_VALUES = {
    "log_completions_hub_repo": {"log_completions": True, "log_completions_hub_repo": "org/completions"},
    "use_transformers_continuous_batching": {"use_transformers_continuous_batching": True},
    "transformers_continuous_batching_config": {
        "transformers_continuous_batching_config": {"max_batch_tokens": 8}
    },
    "use_transformers_paged": {"use_transformers_paged": True},
    "fsdp": {"fsdp": "full_shard"},
    "fsdp_config": {"fsdp": "full_shard", "fsdp_config": {"min_num_params": 1}},
}


def test_every_grpo_field_is_classified():
    assert set(GRPO_OPTIONS) == GRPO_FIELDS, "classify new TRL fields in vlm_grpo/trl_options.py"
    assert set(TRAINING_ARGUMENTS) <= TRAINING_FIELDS


@pytest.mark.parametrize("name", sorted(n for n, e in GRPO_OPTIONS.items() if isinstance(e, Honoured)))
def test_honoured_option_points_at_a_real_test(name):
    file, _, test = GRPO_OPTIONS[name].test.partition("::")
    function, _, case = test.partition("[")
    source = (ROOT / file).read_text()
    assert re.search(rf"^def {re.escape(function)}\(", source, re.MULTILINE), f"{file} has no {function}"
    if case:
        assert f'"{case.rstrip("]")}":' in source, f"{file} has no case {case}"


@pytest.mark.parametrize("name", sorted(rejected_option_names()))
def test_rejected_option_fails_at_construction_with_its_message(name, tmp_path):
    entry = {**GRPO_OPTIONS, **TRAINING_ARGUMENTS}[name]
    assert isinstance(entry, Rejected)
    with pytest.raises(VLMGRPOError) as error:
        grpo_args(tmp_path, **REJECTING_VALUES[name])
    assert str(error.value) == entry.message and "\n" not in entry.message


def test_defaults_are_accepted(tmp_path):
    grpo_args(tmp_path)  # TRL's defaults of every rejected option pass


def test_readme_lists_the_rejected_options():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in rejected_option_names() if f"`{name}`" not in readme]
    assert missing == []
