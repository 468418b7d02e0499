"""How a process of a multi-process run ends (`vlm_grpo.runtime.shutdown`): what a normal exit runs still runs.

The 2-process runs of `test_distributed.py` and `test_resume.py` end through it (they fail on "terminate called" in
their logs); these tests check, in a subprocess, what it must keep from a normal exit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = """
import atexit, logging, sys, threading, time
from pathlib import Path
from vlm_grpo.runtime.shutdown import exit_process

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
handler = logging.FileHandler(out / "log.txt", delay=False)
logging.getLogger("probe").addHandler(handler)
logging.getLogger("probe").warning("logged before the exit")

def late_writer():
    time.sleep(0.3)
    (out / "thread").write_text("joined")

threading.Thread(target=late_writer).start()
print("printed before the exit", end="")
exit_process(int(sys.argv[2]))
print("never printed")
"""


def run_script(tmp_path: Path, status: int) -> subprocess.CompletedProcess:
    script = tmp_path / "ends.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(status)], capture_output=True, text=True, timeout=60
    )


def test_exit_process_runs_what_a_normal_exit_runs(tmp_path):
    result = run_script(tmp_path, 75)
    assert result.returncode == 75, result.stderr
    assert result.stdout == "printed before the exit"  # stdout flushed, nothing after the exit
    assert (tmp_path / "atexit").read_text() == "ran"  # exit handlers (trackers, loggers)
    assert (tmp_path / "thread").read_text() == "joined"  # a non-daemon thread finished its write
    assert (tmp_path / "log.txt").read_text() == "logged before the exit\n"


def test_exit_process_status_zero(tmp_path):
    assert run_script(tmp_path, 0).returncode == 0


def test_finish_processes_without_a_process_group_is_a_no_op():
    from vlm_grpo.runtime.shutdown import finish_processes

    released = []
    assert finish_processes(lambda: released.append(True)) is False
    assert released == []  # nothing to release without a process group
