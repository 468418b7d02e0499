"""The names and help of every `vlm-grpo train` option, read in a few milliseconds, without importing TRL.

Building the real option parser (`vlm_grpo.cli.options.build_parser`) imports TRL, transformers and torch: seconds on an
idle machine, up to a minute on a busy one. `vlm-grpo train --help` and the refusal of an unknown key or flag must
not wait for that, so `read_options` reads the options from the installed source files that declare them, with
`ast` and without importing them: our `ScriptArguments` (`vlm_grpo/train.py`), `VLMGRPOConfig` and `VLMModelConfig`
(`vlm_grpo/config.py`) and, up their base classes, TRL's `GRPOConfig` and `ModelConfig` and transformers'
`TrainingArguments`. Each dataclass field becomes options as `transformers.HfArgumentParser` makes them: `--name`,
`--name-with-dashes`, the field's `aliases`, and `--no_name` / `--no-name` for a `bool` that defaults to true.

Reading the installed files, rather than a list shipped with this package, keeps the options right for whichever
TRL and transformers versions are installed; `tests/test_cli.py` checks them against the real parser (CI runs it
at the newest and at the lowest supported versions). A declaration this reader does not understand (a base class
it cannot find, a field's help that is not a literal) makes `read_options` return None, and every check then runs
after the heavy import, on the real parser, as the full parse always does too.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

COMMON_OPTIONS = (
    "model_name_or_path", "data_config", "rewards", "eval_data_config", "output_dir", "dtype",
    "use_peft", "lora_r", "lora_alpha", "load_in_4bit",
    "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "max_completion_length", "temperature", "beta", "loss_type", "steps_per_generation",
    "num_iterations", "gradient_checkpointing", "bf16", "use_vllm", "vllm_mode", "deepspeed",
    "logging_steps", "save_steps", "report_to", "resume_from_checkpoint", "seed",
)  # fmt: skip
"""The options `train --help` shows after ours; `--help-all` shows every one."""

TRAIN_DATACLASSES = (
    ("vlm_grpo.cli.options", "ScriptArguments"),
    ("vlm_grpo.config", "VLMGRPOConfig"),
    ("vlm_grpo.config", "VLMModelConfig"),
)
"""The dataclasses `vlm-grpo train` parses, in the parser's order, as `(module, class)`."""

TRL_CONFIG = ("trl.trainer.grpo_config", "GRPOConfig")
"""The config `VLMGRPOConfig` extends: its fields that this one lacks are our own options, shown first by `--help`."""

_LAZY_EXPORTS = {
    "trl.GRPOConfig": "trl.trainer.grpo_config",
    "trl.ModelConfig": "trl.trainer.model_config",
    "transformers.TrainingArguments": "transformers.training_args",
}
"""Where the classes that TRL and transformers export lazily from their top-level package are declared."""

_NO_DEFAULT = object()


class _Unreadable(Exception):
    """A declaration the source reader does not understand; the options then come from the real parser."""


@dataclass(frozen=True)
class _Field:
    """One dataclass field as `HfArgumentParser` sees it."""

    name: str
    init: bool
    is_bool: bool
    default: Any
    help: str
    aliases: tuple[str, ...]

    def flags(self) -> list[str]:
        """The option strings `HfArgumentParser` gives the field, in its order."""
        flags = [f"--{self.name}", *([f"--{self.name.replace('_', '-')}"] if "_" in self.name else [])]
        flags += self.aliases
        if self.is_bool and self.default is True:  # its `--no_*` complement
            flags += [f"--no_{self.name}", f"--no-{self.name.replace('_', '-')}"]
        return flags


def read_options() -> dict[str, Any] | None:
    """`{"names", "flags", "help", "defaults", "own"}` of `vlm-grpo train`, read from the source, or None.

    `names` are the YAML keys (sorted), `flags` the command-line option strings that start with `--` (sorted),
    `help` each name's help text (in the parser's order), `defaults` each name's default where it is a literal, and
    `own` the names of our own options, in `--help` order. The same as `vlm_grpo.cli.options.parser_options` gives for the
    real parser; None when a declaration cannot be read without importing it.
    """
    try:
        return _read_options()
    except (_Unreadable, OSError, SyntaxError, ValueError, AttributeError, KeyError, TypeError):
        return None  # declarations written in a way this reader does not follow: the real parser decides


@cache
def _read_options() -> dict[str, Any]:
    fields_of = [[f for f in _class_fields(module, name) if f.init] for module, name in TRAIN_DATACLASSES]
    every = [f for fields in fields_of for f in fields]
    trl_names = {f.name for f in _class_fields(*TRL_CONFIG)}
    script = [f.name for f in fields_of[0]]
    own = ["model_name_or_path", *script] + [f.name for f in fields_of[1] if f.name not in trl_names]
    actions = {f.name: 2 if f.is_bool and f.default is True else 1 for f in every}
    return {
        "names": sorted({f.name for f in every}),
        "flags": sorted({flag for f in every for flag in f.flags() if flag.startswith("--")}),
        "help": {f.name: f.help for f in every},
        "defaults": {f.name: f.default for f in every if f.default is not _NO_DEFAULT},
        "own": [name for name in own for _ in range(actions[name])],  # as the parser lists its actions
    }


def _module_file(module: str) -> Path:
    """The source file of `module`, found without importing it (nor its package)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise _Unreadable(f"package {top} not found")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@cache
def _module_tree(module: str) -> ast.Module:
    return ast.parse(_module_file(module).read_text(encoding="utf-8"))


def _class_node(module: str, name: str) -> ast.ClassDef | None:
    return next(
        (n for n in _module_tree(module).body if isinstance(n, ast.ClassDef) and n.name == name), None
    )


def _defining_module(module: str, name: str) -> str:
    """The module that declares the class `name`, which `module` declares or imports."""
    if _class_node(module, name) is not None:
        return module
    package = module if _module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    for node in _module_tree(module).body:
        if not isinstance(node, ast.ImportFrom) or not any((a.asname or a.name) == name for a in node.names):
            continue
        original = next(a.name for a in node.names if (a.asname or a.name) == name)
        source = node.module or ""
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*base, *([source] if source else [])])
        if f"{source}.{original}" in _LAZY_EXPORTS:
            return _LAZY_EXPORTS[f"{source}.{original}"]
        if _class_node(source, original) is None:
            raise _Unreadable(f"{source}.{original}")
        return source
    raise _Unreadable(f"{module}.{name}")


@cache
def _class_fields(module: str, name: str) -> tuple[_Field, ...]:
    """The dataclass fields of `module.name`, base classes' first, as `dataclasses.fields` orders them."""
    node = _class_node(module, name)
    if node is None or not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
        raise _Unreadable(f"{module}.{name} is not a dataclass declared there")
    fields: dict[str, _Field] = {}
    for base in node.bases:
        if not isinstance(base, ast.Name):
            raise _Unreadable(f"{module}.{name}: base {ast.unparse(base)}")
        for field in _class_fields(_defining_module(module, base.id), base.id):
            fields[field.name] = field
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if "ClassVar" not in ast.unparse(statement.annotation):
                field = _read_field(statement)
                fields[field.name] = field  # a redeclared field keeps its place, as in `dataclasses`
    return tuple(fields.values())


def _read_field(statement: ast.AnnAssign) -> _Field:
    """A field from its declaration: `name: type = default` or `name: type = field(...)`."""
    name = statement.target.id
    value = statement.value
    keywords: dict[str, ast.expr] = {}
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
        keywords = {k.arg: k.value for k in value.keywords if k.arg is not None}
        if value.args or len(keywords) < len(value.keywords):
            raise _Unreadable(f"field {name}: positional or ** arguments")
        default = _literal(keywords["default"]) if "default" in keywords else _NO_DEFAULT
        if "default_factory" in keywords:
            default = _factory_default(keywords["default_factory"])
    else:
        default = _NO_DEFAULT if value is None else _literal(value)
    try:
        metadata = _help_and_aliases(keywords["metadata"]) if "metadata" in keywords else {}
        init = ast.literal_eval(keywords["init"]) if "init" in keywords else True
    except ValueError as error:
        raise _Unreadable(f"field {name}: its help, aliases or init is not a literal") from error
    aliases = metadata.get("aliases", [])
    members = _union_members(statement.annotation)
    if _parsed_type(members).partition("[")[0] in ("list", "List"):  # only a default_factory sets its default
        default = _factory_default(keywords["default_factory"]) if "default_factory" in keywords else None
    return _Field(
        name=name,
        init=bool(init),
        is_bool=_parsed_type(members) == "bool" or sorted(members) == ["None", "bool"],
        default=default,
        help=metadata.get("help") or "",
        aliases=tuple([aliases] if isinstance(aliases, str) else aliases),
    )


def _help_and_aliases(node: ast.expr) -> dict[str, Any]:
    """The `help` and `aliases` of a field's `metadata={...}` (its other keys, such as `choices`, may be code)."""
    if not isinstance(node, ast.Dict):
        raise ValueError("metadata is not a {...} mapping")
    return {
        key.value: ast.literal_eval(value)
        for key, value in zip(node.keys, node.values)
        if isinstance(key, ast.Constant) and key.value in ("help", "aliases")
    }


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NO_DEFAULT


def _factory_default(node: ast.expr) -> Any:
    """The value of `default_factory=list`, `dict` or `lambda: <literal>`, else no known default."""
    if isinstance(node, ast.Name) and node.id in ("list", "dict"):
        return [] if node.id == "list" else {}
    if isinstance(node, ast.Lambda):
        return _literal(node.body)
    return _NO_DEFAULT


def _union_members(node: ast.expr) -> list[str]:
    """The members of a type annotation, `["bool", "None"]` for `bool | None` or `Optional[bool]`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    if isinstance(node, ast.Subscript):
        kind = ast.unparse(node.value).rpartition(".")[2]
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if kind == "Optional":
            return [*_union_members(items[0]), "None"]
        if kind == "Union":
            return [member for item in items for member in _union_members(item)]
    if isinstance(node, ast.Constant) and node.value is None:
        return ["None"]
    return [ast.unparse(node)]


def _parsed_type(members: list[str]) -> str:
    """The type `HfArgumentParser` parses a field of these union members as: it drops `str`, or `None` (unless the
    other member is `bool`), from a union."""
    if len(members) == 1:
        return members[0]
    if "None" not in members:
        return members[0] if members[1] == "str" else members[1]
    if "bool" not in members:
        return members[0] if members[1] == "None" else members[1]
    return " | ".join(members)


def short_help(options: dict[str, Any], usage: str, every: bool = False) -> str:
    """`train --help`: our options, then the common TRL and transformers ones, with their help.

    Args:
        options (`dict`): from `read_options` (or `vlm_grpo.cli.options.parser_options`).
        usage (`str`): the usage line.
        every (`bool`, *optional*, defaults to `False`): `--help-all`: every option, with its default.
    """
    more = "This lists every option." if every else "`vlm-grpo train --help-all` lists every option."
    lines = [f"usage: {usage}", "", "Train a vision-language model with GRPO. CONFIG.yaml gives a value to any option below;",
             f"a flag on the command line overrides it. {more}", ""]  # fmt: skip
    if every:
        lines += ["Every option is also spelt with dashes (--learning-rate); a true/false option that defaults to",
                  "true is turned off with --no_NAME.", ""]  # fmt: skip
    own = list(dict.fromkeys(options["own"]))
    others = [name for name in (options["help"] if every else COMMON_OPTIONS) if name not in own]
    title = "TRL and transformers options" if every else "common TRL and transformers options"
    for heading, names in (("vlm_grpo options", own), (title, others)):
        lines.append(f"{heading}:")
        for name in names:
            text = " ".join(str(options["help"].get(name) or "").split())
            if every and name in options.get("defaults", {}):
                text += f" (default: {options['defaults'][name]!r})"
            wrapped = textwrap.wrap(text, 110 - 35) or [""]
            lines.append(f"  --{name:<30} {wrapped[0]}")
            lines += [" " * 35 + line for line in wrapped[1:]]
        lines.append("")
    return "\n".join(lines)
