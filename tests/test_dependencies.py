"""The dependency ranges: `.[vllm]` resolves against the package index, and the floor CI tests is their floor.

`setup.cfg` declares ranges; `make test` runs the suite at their newest versions and `make test-floor` at the
versions pinned in `ci/floor-constraints.txt`. The resolver test asks pip (`--dry-run --report`, nothing is
installed) what `pip install ".[vllm]"` would install today, so a new release that breaks the combination of
this package, TRL and vLLM fails here rather than on a user's machine.
"""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FLOOR_CONSTRAINTS = ROOT / "ci" / "floor-constraints.txt"
RESOLVE_TIMEOUT = 1200  # seconds; pip fetches the metadata (and for some wheels the files) of ~200 packages


def declared_requirements() -> dict[str, list[Requirement]]:
    """setup.cfg's requirements: `install_requires` under "", each extra under its name."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = {"": config["options"]["install_requires"]}
    lines.update(config["options.extras_require"])
    return {
        group: [Requirement(line) for line in text.splitlines() if line.strip()]
        for group, text in lines.items()
    }


def floor_pins() -> dict[str, Version]:
    """`ci/floor-constraints.txt` as {canonical name: pinned version}."""
    pins = {}
    for line in FLOOR_CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"{line}: the floor pins exact versions"
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def lower_bound(specifier: SpecifierSet) -> Version:
    """The lowest version a range admits: its `>=` bound, or the release of an `==X` / `==X.*` pin."""
    bounds = [Version(s.version.removesuffix(".*")) for s in specifier if s.operator in (">=", "==", "~=")]
    assert len(bounds) == 1, f"{specifier}: expected exactly one lower bound"
    return bounds[0]


def trl_vllm_range() -> SpecifierSet:
    """The vLLM versions the installed TRL supports, from its own `vllm` extra."""
    for line in requires("trl") or []:
        requirement = Requirement(line)
        if (
            requirement.name == "vllm"
            and requirement.marker
            and requirement.marker.evaluate({"extra": "vllm"})
        ):
            return requirement.specifier
    raise AssertionError("the installed TRL declares no vllm extra")


# ------------------------------------------------------------------------------------------------------ offline
def test_floor_constraints_pin_the_floor_of_every_range():
    """Every range CI claims to test starts at the version `make test-floor` installs, and nothing else is pinned."""
    pins = floor_pins()
    declared = declared_requirements()
    tested = declared[""] + declared["dev"] + declared["deepspeed"] + declared["qlora"]
    expected = {}
    for requirement in tested:
        name = canonicalize_name(requirement.name)
        expected[name] = lower_bound(requirement.specifier)
        assert name in pins, f"{requirement} has no floor in {FLOOR_CONSTRAINTS.name}"
        assert pins[name] in requirement.specifier, f"floor {name}=={pins[name]} is outside {requirement}"
    assert pins == expected


def test_ranges_are_bounded_above_where_internals_are_used():
    """torch, transformers and TRL move fast: each range stops below a version the suite has not run against."""
    declared = {canonicalize_name(r.name): r.specifier for r in declared_requirements()[""]}
    for name in ("torch", "torchvision", "transformers", "trl", "peft", "accelerate", "datasets"):
        assert any(s.operator in ("<", "<=", "==") for s in declared[name]), f"{name} has no upper bound"
    assert declared["trl"] == SpecifierSet("==1.16.*")


def vllm_extra() -> dict[str, SpecifierSet]:
    """The `vllm` extra as {canonical name: specifier}."""
    return {canonicalize_name(r.name): r.specifier for r in declared_requirements()["vllm"]}


def test_vllm_extra_stays_inside_trls_supported_range():
    ours = {s.operator: Version(s.version) for s in vllm_extra()["vllm"]}
    theirs = {s.operator: Version(s.version) for s in trl_vllm_range()}
    assert ours[">="] >= theirs[">="] and ours["<="] <= theirs["<="], (ours, theirs)


def test_vllm_extra_holds_the_install_to_the_tested_floor():
    """With vLLM, torch, torchvision and transformers are those of the floor, and inside the project's ranges."""
    pins = floor_pins()
    main = {canonicalize_name(r.name): r.specifier for r in declared_requirements()[""]}
    extra = vllm_extra()
    for name in ("torch", "torchvision", "transformers"):
        assert pins[name] in extra[name], (
            f"the floor {name}=={pins[name]} is outside the vllm extra's {extra[name]}"
        )
        assert lower_bound(extra[name]) == lower_bound(main[name]), (name, extra[name], main[name])


# ------------------------------------------------------------------------------------------------ the resolver
@pytest.fixture(scope="module")
def vllm_resolution(tmp_path_factory) -> dict[str, dict]:
    """What `pip install ".[vllm]"` would install into an empty environment: {canonical name: report item}."""
    report = tmp_path_factory.mktemp("resolve") / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        f"{ROOT}[vllm]",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT)
    assert proc.returncode == 0, (
        f"pip could not resolve .[vllm]:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    items = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item for item in items}


def resolved_version(resolution: dict[str, dict], name: str) -> Version:
    assert name in resolution, f"{name} is not part of the resolution"
    return Version(resolution[name]["metadata"]["version"])


@pytest.mark.once  # the package index's answer does not depend on the venv
def test_vllm_extra_resolves_inside_every_range(vllm_resolution):
    vllm = resolved_version(vllm_resolution, "vllm")
    assert Version(vllm.base_version) in trl_vllm_range(), f"vLLM {vllm} is outside TRL's supported range"

    # The project itself is part of the resolution, with the requirements of this checkout.
    assert vllm_resolution["vlm-grpo"]["requested_extras"] == ["vllm"]
    for requirement in declared_requirements()[""] + declared_requirements()["vllm"]:
        version = resolved_version(vllm_resolution, canonicalize_name(requirement.name))
        assert requirement.specifier.contains(version, prereleases=True), f"{requirement.name} {version}"


@pytest.mark.once  # the package index's answer does not depend on the venv
def test_vllm_extra_resolves_to_the_tested_floor(vllm_resolution):
    """vLLM pins torch and torchvision exactly and caps transformers: the floor CI tests must be that pair and
    inside that cap, or the vllm extra installs versions the suite never ran on."""
    pins = floor_pins()
    for name in ("torch", "torchvision"):
        version = resolved_version(vllm_resolution, name)
        assert Version(version.base_version) == pins[name], (
            f"vLLM needs {name} {version}, the floor is {pins[name]}"
        )
    vllm_needs = {
        canonicalize_name(r.name): r.specifier
        for r in map(Requirement, vllm_resolution["vllm"]["metadata"]["requires_dist"])
        if not r.marker
    }
    assert pins["transformers"] in vllm_needs["transformers"], (
        pins["transformers"],
        vllm_needs["transformers"],
    )
    assert resolved_version(vllm_resolution, "transformers") >= pins["transformers"]
