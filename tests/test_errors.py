"""User errors are `VLMGRPOError` and print one line with exit status 1; anything else keeps its traceback."""

from __future__ import annotations

import argparse
import logging

import pytest

from vlm_grpo.data import DataConfigError
from vlm_grpo.errors import EXIT_USER_ERROR, VLMGRPOError, run_cli
from vlm_grpo.rewards.guard import RewardError


def fails_with(error: BaseException):
    def main(argv: list[str]) -> None:
        raise error

    return main


def test_user_error_is_one_line_and_exit_1(capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli("plot", fails_with(VLMGRPOError("run folder x\n  not found; pass a run")), [])
    assert exc.value.code == EXIT_USER_ERROR == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "vlm-grpo plot: error: run folder x not found; pass a run (add --debug for the traceback)"
    ]


@pytest.mark.parametrize("error", [TypeError("bug"), KeyError("bug"), ImportError("bug"), OSError("bug")])
def test_other_errors_keep_their_traceback(error, capsys):
    with pytest.raises(type(error)):
        run_cli("train", fails_with(error), [])
    assert "error:" not in capsys.readouterr().err


def test_plain_value_error_is_not_a_user_error():
    with pytest.raises(ValueError, match="internal"):
        run_cli("train", fails_with(ValueError("internal")), [])


def test_debug_reraises_user_errors():
    with pytest.raises(VLMGRPOError, match="bad"):
        run_cli("train", fails_with(VLMGRPOError("bad")), ["--debug"])


def test_argparse_usage_errors_exit_1(capsys):
    def main(argv: list[str]) -> None:
        parser = argparse.ArgumentParser(prog="vlm-grpo plot")
        parser.add_argument("run_dir")
        parser.parse_args(argv)

    with pytest.raises(SystemExit) as exc:
        run_cli("plot", main, [])
    assert exc.value.code == 1
    assert "the following arguments are required: run_dir" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        run_cli("plot", main, ["--help"])
    assert exc.value.code == 0


def test_data_and_reward_errors_are_user_errors():
    assert issubclass(DataConfigError, VLMGRPOError) and issubclass(RewardError, VLMGRPOError)
    assert issubclass(VLMGRPOError, ValueError)


def test_missing_kernels_package_notice_is_dropped_and_other_records_pass(caplog):
    import vlm_grpo  # noqa: F401  (installs the filter)

    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        bnb.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
            "`pip install kernels` and the kernels >= 0.11.1",
            "No module named 'kernels'",
        )
        bnb.warning("a real bitsandbytes problem")
    assert [r.getMessage() for r in caplog.records] == ["a real bitsandbytes problem"]
