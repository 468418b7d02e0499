"""Bad input: one line naming what and where, exit status 1, no traceback, no damaged checkpoint."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import color_dataset, grpo_args, length_reward, square_image, write_color_data, write_train_yaml
from PIL import Image

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.cli.main import main as cli_main
from vlm_grpo.data.rows import load_rows
from vlm_grpo.testing import DEFAULT_FAMILY, FAMILIES
from vlm_grpo.trainer.checkpoints import is_complete


def error_line(capsys, *argv: str) -> str:
    """Run `vlm-grpo ARGV`, expect exit status 1, return the single error line (and check there is one)."""
    with pytest.raises(SystemExit) as exc:
        cli_main(list(argv))
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line[line.index("vlm-grpo ") :] for line in err.splitlines() if "vlm-grpo " in line]
    assert len(lines) == 1 and ": error: " in lines[0], err[-2000:]
    return lines[0]


@pytest.fixture
def data(tmp_path):
    return write_color_data(tmp_path / "data")


def test_missing_image(tiny_model, tmp_path, data, capsys):
    (tmp_path / "data" / "images" / "3.png").unlink()
    line = error_line(capsys, "train", str(write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data)))
    assert "train.json" in line and "record 4" in line and "'image'" in line and "3.png" in line


def test_corrupt_image(tiny_model, tmp_path, data, capsys):
    (tmp_path / "data" / "images" / "5.png").write_bytes(b"not a png at all")
    line = error_line(capsys, "train", str(write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data)))
    assert "train.json" in line and "record 6" in line and "5.png" in line


def test_unknown_yaml_key(tiny_model, tmp_path, data, capsys):
    path = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, learning_rat=1e-4)
    line = error_line(capsys, "train", str(path))
    assert "unknown key 'learning_rat' (did you mean 'learning_rate'?)" in line


def test_misspelt_key_is_reported_before_the_batch_size_error(tiny_model, tmp_path, data, capsys):
    path = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, num_generation=4)
    (tmp_path / "train.yaml").write_text(
        (tmp_path / "train.yaml")
        .read_text()
        .replace("num_generations: 2\n", "")  # TRL's default 8 then fails
    )
    line = error_line(capsys, "train", str(path))
    assert "'num_generation' (did you mean 'num_generations'?)" in line and "divisible" not in line


def test_misspelt_reward_entry_key(tiny_model, tmp_path, data, capsys):
    path = write_train_yaml(
        tmp_path, tiny_model(DEFAULT_FAMILY), data, rewards=[{"name": "iou", "wieght": 2}]
    )
    line = error_line(capsys, "train", str(path))
    assert "reward 'iou': unknown key 'wieght' (did you mean 'weight'?)" in line


def test_yaml_syntax_error_names_the_file(tmp_path, capsys):
    (tmp_path / "train.yaml").write_text("model_name_or_path: x\n  rewards: [\n")
    line = error_line(capsys, "train", str(tmp_path / "train.yaml"))
    assert "train.yaml: not valid YAML" in line


def test_a_genuine_bug_keeps_its_traceback(tiny_model, tmp_path, data, monkeypatch):
    import vlm_grpo.data

    def broken_loader(*args, **kwargs):
        raise TypeError("a bug inside vlm_grpo")

    monkeypatch.setattr(vlm_grpo.data, "load_data_config", broken_loader)
    with pytest.raises(TypeError, match="a bug inside vlm_grpo"):  # not turned into a one-line SystemExit
        cli_main(["train", str(write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data))])


def test_unknown_reward_name_lists_builtins(tiny_model, tmp_path, data, capsys):
    path = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, rewards=["choice_acc"])
    line = error_line(capsys, "train", str(path))
    assert "choice_acc" in line and "choice_accuracy" in line and "iou" in line


USER_REWARDS = """
def explodes(completions, solution, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 1 and "blue" in solution:
        raise ZeroDivisionError("division by zero in my reward")
    return [1.0] * len(completions)

def too_few(completions, **kwargs):
    return [1.0] * (len(completions) - 1)"""


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(USER_REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_reward_that_raises_names_reward_and_record_and_keeps_checkpoint(
    tiny_model, tmp_path, data, capsys, user_rewards
):
    path = write_train_yaml(
        tmp_path,
        tiny_model(DEFAULT_FAMILY),
        data,
        rewards=["user_rewards.explodes"],
        max_steps=3,
        save_strategy="steps",
        save_steps=1,
        shuffle_dataset=False,
    )
    line = error_line(capsys, "train", str(path))
    assert "reward 'explodes'" in line and "ZeroDivisionError" in line and "division by zero" in line
    assert "record" in line and "blue" in line  # the failing record is named by its fields
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert is_complete(checkpoint) and (checkpoint / "model.safetensors").exists()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 1


@pytest.mark.parametrize(("reward", "expected"), [("too_few", "returned 3 values for 4")])
def test_reward_returning_bad_values(tiny_model, tmp_path, data, capsys, user_rewards, reward, expected):
    path = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, rewards=[f"user_rewards.{reward}"])
    line = error_line(capsys, "train", str(path))
    assert f"reward '{reward}'" in line and expected in line


def test_unknown_model_type(tmp_path, data, capsys):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4})
    )
    line = error_line(capsys, "train", str(write_train_yaml(tmp_path, str(model), data)))
    assert "Unsupported model_type 'llama'" in line and all(f.model_type in line for f in FAMILIES.values())


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_missing_model_folder_is_named(tmp_path, data, capsys, monkeypatch, where):
    """An absolute path, and a relative `runs/missing` under a local `runs/` folder (a hub id's shape)."""
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    model = str(tmp_path / "runs" / "missing") if where == "absolute" else "runs/missing"
    line = error_line(capsys, "train", str(write_train_yaml(tmp_path, model, data)))
    assert f"model folder {model} not found" in line


def test_hub_id_that_cannot_be_fetched_is_one_line(tmp_path, data, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # for processes started from here
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # this one read it at import
    line = error_line(capsys, "train", str(write_train_yaml(tmp_path, "no-such-org/no-such-model", data)))
    assert (
        "model no-such-org/no-such-model is no local folder, and fetching it from the Hugging Face hub"
        in line
    )


def test_remote_code_model_needs_explicit_opt_in(tmp_path, data, capsys):
    model = tmp_path / "custom"
    model.mkdir()
    config = {"model_type": "custom_vlm", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    (model / "config.json").write_text(json.dumps(config))
    line = error_line(capsys, "train", str(write_train_yaml(tmp_path, str(model), data)))
    assert "trust_remote_code: true" in line and "custom" in line


def test_batch_size_not_divisible_by_num_generations(tiny_model, tmp_path, data, capsys):
    path = write_train_yaml(
        tmp_path, tiny_model(DEFAULT_FAMILY), data, per_device_train_batch_size=3, num_generations=2
    )
    line = error_line(capsys, "train", str(path))
    assert "num_generations" in line and "divisible" in line


def test_dataset_smaller_than_one_batch(tiny_model, tmp_path, capsys):
    data = write_color_data(tmp_path / "data", n=2)
    path = write_train_yaml(
        tmp_path, tiny_model(DEFAULT_FAMILY), data, per_device_train_batch_size=8, num_generations=2
    )
    line = error_line(capsys, "train", str(path))
    assert "2 prompts" in line and "needs 4" in line


def test_debug_keeps_the_traceback(tiny_model, tmp_path, data):
    path = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, rewards=["choice_acc"])
    with pytest.raises(ValueError, match="choice_acc"):
        cli_main(["train", str(path), "--debug"])


def test_image_above_pixel_limit_is_resized(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=1, max_pixels=56 * 56),
        train_dataset=color_dataset(8),
    )
    big = {"prompt": color_dataset(1)[0]["prompt"], "images": [square_image("red", size=1024)]}
    encoded = trainer.rollout.encode_prompts(load_rows([big]))[0]
    image_tokens = sum(t == trainer.model.config.image_token_id for t in encoded.input_ids)
    assert image_tokens == 4  # 56x56 pixels at most: 4 merged patches, whatever the input size


def test_prompt_longer_than_context_is_explained(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=1),
        train_dataset=color_dataset(8),
    )
    trainer.family.context_length = lambda config: 12  # as if the model had a 12-token context
    row = color_dataset(1, images_per_prompt=2)[0]
    with pytest.raises(ValueError, match=r"8 of them for its 2 image\(s\).*context of 12 tokens.*max_pixels"):
        trainer.rollout.encode_prompts(load_rows([row]))


def test_prompt_too_long_because_of_its_video_names_the_video_options(tiny_model, tmp_path):
    """A prompt whose video makes it too long is explained by its video and the video options, not by images."""
    from test_video import video_rows

    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=1),
        train_dataset=color_dataset(8),
    )
    trainer.family.context_length = lambda config: 12  # as if the model had a 12-token context
    (tmp_path / "clips").mkdir()
    with pytest.raises(ValueError) as error:
        trainer.rollout.encode_prompts(load_rows(video_rows(tmp_path / "clips", 1)))
    message = str(error.value)
    assert "its 1 video(s) and 0 image(s)" in message and "context of 12 tokens" in message
    assert "video_max_pixels, video_fps or video_max_frames" in message and "max_pixels (or" not in message


def test_trust_remote_code_is_off_by_default():
    from vlm_grpo import VLMGRPOConfig

    assert VLMGRPOConfig(output_dir="x", use_cpu=True).trust_remote_code is False


def test_corrupt_image_is_never_replaced(tmp_path):
    from vlm_grpo.data import DataConfigError, load_data_config

    data = write_color_data(tmp_path / "data")
    Image.new("RGB", (4, 4)).save(tmp_path / "data" / "images" / "1.png")  # a valid image stays valid
    (tmp_path / "data" / "images" / "2.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(DataConfigError, match="record 3"):
        load_data_config(data)


def test_yaml_is_read_with_a_safe_loader(tmp_path, capsys):
    from vlm_grpo.data import DataConfigError, load_data_config

    marker = tmp_path / "pwned"
    evil = f"!!python/object/apply:os.system ['touch {marker}']\n"
    (tmp_path / "data.yaml").write_text("datasets:\n  - json_path: " + evil)
    with pytest.raises(DataConfigError):
        load_data_config(tmp_path / "data.yaml")
    (tmp_path / "train.yaml").write_text("model_name_or_path: " + evil)
    error_line(capsys, "train", str(tmp_path / "train.yaml"))
    assert not marker.exists()
