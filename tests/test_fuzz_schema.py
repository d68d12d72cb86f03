"""Generated bad input (hypothesis, derandomized): every field of the ES and GRPO job configs across types and
ranges, corruptions of every file a command reads, the Python API's arguments, and the CLI's backstop.

Each CLI case checks: non-zero exit, one line on stderr naming the problem, no traceback, inputs unchanged and
nothing written. The oracle for the config fields is each field's own declaration (its type and its
`annotated_types` bounds): a value outside it must be refused naming the key, a value inside it must load.
The table-driven cases are in test_fuzz_cli.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import annotated_types as at
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcore.cli
from jaxcore.config.yaml_config import YAML_NULLS, is_text_field, load_config
from jaxcore.es.config import ESConfig
from jaxcore.grpo.config import GRPOConfig

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=10,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PER_FIELD = settings(FUZZ, max_examples=6)        # x 2 tests x ~130 fields


# --------------------------------------------------------------------------- the fields and their declarations

def section_of(hint: Any) -> type | None:
    """The dataclass a field holds (also an optional one), else None."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    sections = [a for a in options if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return sections[0] if sections else None


def leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, annotation) of every plain setting of a job config, sections (optional ones too) walked."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for name, hint in ((f.name, hints[f.name]) for f in dataclasses.fields(cls)):
        section = section_of(hint)
        if section is not None:
            if section is not hint:                           # an optional section: also a value of its own
                out.append((f"{prefix}{name}", hint))
            out.extend(leaf_fields(section, f"{prefix}{name}."))
        else:
            out.append((f"{prefix}{name}", hint))
    return out


ES_FIELDS = leaf_fields(ESConfig)
GRPO_FIELDS = leaf_fields(GRPOConfig)


@dataclasses.dataclass
class Declaration:
    """A field's declaration, read from its annotation: the base type, the allowed choices, the bounds."""

    base: Any
    optional: bool = False
    alternatives: tuple[Declaration, ...] = ()       # of a union of several types (`str | dict[str, str]`)
    choices: tuple = ()
    bounds: dict[str, float] = dataclasses.field(default_factory=dict)
    multiple_of: int | None = None
    min_len: int = 0


def declaration(hint: Any) -> Declaration:
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) > 1:
            return Declaration(typing.Union, optional, alternatives=tuple(declaration(a) for a in args))
        hint = args[0]
    metadata: tuple = ()
    if typing.get_origin(hint) is typing.Annotated:
        hint, *rest = typing.get_args(hint)
        metadata = tuple(rest)
    decl = Declaration(hint, optional)
    if typing.get_origin(hint) is typing.Literal:
        decl.choices = typing.get_args(hint)
    for item in metadata:
        for part in (item if isinstance(item, at.Interval) else [item]):
            for bound in ("gt", "ge", "lt", "le"):
                if getattr(part, bound, None) is not None:
                    decl.bounds[bound] = getattr(part, bound)
            if isinstance(part, at.MultipleOf):
                decl.multiple_of = part.multiple_of
            if isinstance(part, at.MinLen):
                decl.min_len = part.min_length
    return decl


WORDS = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
    lambda w: yaml.safe_load(w) == w and w.lower().lstrip("+-") not in ("nan", "inf"))
NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


# Values of each kind of YAML/Python value, and the kinds a declared type accepts.
KINDS = {"int": st.integers(), "float": st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: not f.is_integer()), "bool": st.booleans(), "str": WORDS, "list": st.lists(st.integers(), max_size=2),
    "dict": st.dictionaries(WORDS, st.integers(), min_size=1, max_size=1)}


def accepted_kinds(decl: Declaration) -> set[str]:
    base, origin = decl.base, typing.get_origin(decl.base)
    if decl.alternatives:
        return set().union(*(accepted_kinds(a) for a in decl.alternatives))
    if origin is typing.Literal or base is str:
        return {"str"}
    if origin in (list, Sequence):
        return {"list"}
    if origin is dict or dataclasses.is_dataclass(base):
        return {"dict"}
    return {"int", "float"} if base is float else {base.__name__}


def invalid_values(decl: Declaration) -> st.SearchStrategy[Any]:
    """Values the declaration does not allow: another type, or outside the bounds/choices."""
    base, origin = decl.base, typing.get_origin(decl.base)
    if decl.alternatives:
        return st.one_of([values for kind, values in KINDS.items() if kind not in accepted_kinds(decl)])
    if origin is typing.Literal:
        return st.one_of(WORDS.filter(lambda w: w not in decl.choices), st.integers(), st.lists(WORDS, max_size=2))
    if base is bool:
        return st.one_of(st.integers(), WORDS, st.floats(allow_nan=False), st.lists(st.booleans(), max_size=2))
    if base is int:
        bad_type = st.one_of(WORDS, st.booleans(), NOT_FINITE,
                             st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
                             st.lists(st.integers(), max_size=2), st.dictionaries(WORDS, st.integers(), max_size=1))
        return st.one_of(bad_type, *out_of_range(decl, integers=True))
    if base is float:
        bad_type = st.one_of(WORDS, st.booleans(), NOT_FINITE, st.lists(st.floats(allow_nan=False), max_size=2))
        return st.one_of(bad_type, *out_of_range(decl, integers=False))
    if base is str:
        return st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(WORDS, max_size=2))
    if origin in (list, Sequence):
        item = typing.get_args(base)[0]
        bad_item = WORDS if item is float else st.integers()
        empty = [st.just([])] if decl.min_len else []
        return st.one_of(st.integers(), st.lists(bad_item, min_size=1, max_size=3), *empty, WORDS)
    if origin is dict:
        return st.one_of(st.integers(), st.lists(st.integers(), max_size=2), WORDS)
    if dataclasses.is_dataclass(base):                        # an optional section given a scalar
        return st.one_of(st.integers(), WORDS, st.lists(st.integers(), min_size=1, max_size=2))
    raise AssertionError(f"no strategy for {base}")


def out_of_range(decl: Declaration, integers: bool) -> list[st.SearchStrategy[Any]]:
    number = st.integers if integers else (lambda **kw: st.floats(allow_nan=False, allow_infinity=False, **kw))
    b, strategies = decl.bounds, []
    if "ge" in b:
        strategies.append(number(max_value=(b["ge"] - 1 if integers else b["ge"]), **({} if integers else
                                                                                       {"exclude_max": True})))
    if "gt" in b:
        strategies.append(number(max_value=b["gt"]))
    if "le" in b:
        strategies.append(number(min_value=(b["le"] + 1 if integers else b["le"]), **({} if integers else
                                                                                       {"exclude_min": True})))
    if "lt" in b:
        strategies.append(number(min_value=b["lt"]))
    if decl.multiple_of:
        low = int(b.get("ge", b.get("gt", 0)))
        strategies.append(st.integers(min_value=low, max_value=10**6).filter(lambda n: n % decl.multiple_of))
    return strategies


def valid_values(decl: Declaration) -> st.SearchStrategy[Any]:
    """Values the declaration allows (the rules between fields aside)."""
    base, origin = decl.base, typing.get_origin(decl.base)
    if decl.alternatives:
        values = st.one_of([valid_values(a) for a in decl.alternatives])
    elif origin is typing.Literal:
        values = st.sampled_from(decl.choices)
    elif base is bool:
        values = st.booleans()
    elif base in (int, float):
        b = decl.bounds
        low = b.get("ge", b.get("gt", -10**6 if base is int else -1e6))
        high = b.get("le", b.get("lt", 10**6 if base is int else 1e6))
        if base is int:
            values = st.integers(int(low) + ("gt" in b), int(high) - ("lt" in b))
            if decl.multiple_of:
                values = values.map(lambda n: n - n % decl.multiple_of).filter(lambda n: n >= low)
        else:
            values = st.floats(low, high, exclude_min="gt" in b, exclude_max="lt" in b)
    elif base is str:
        values = WORDS
    elif origin in (list, Sequence):
        item = typing.get_args(base)[0]
        values = st.lists(WORDS if item is str else st.floats(-10, 10), min_size=max(decl.min_len, 0), max_size=3)
    elif origin is dict:
        item = typing.get_args(base)[1]
        values = st.dictionaries(WORDS, WORDS if item is str else st.integers(), max_size=2 if item is str else 0)
    elif dataclasses.is_dataclass(base):                      # an optional section: null (its settings are leaves)
        values = st.none()
    else:
        raise AssertionError(f"no strategy for {base}")
    return st.one_of(values, st.none()) if decl.optional else values


# Fields whose valid values other fields constrain (checked by the cross-field rules, not by one field alone).
CROSS_FIELD = {"distributed.process_id", "rollout.temperature", "rollout.generations_per_prompt", "optimizer.name",
               "grpo.steps_per_generation", "grpo.gradient_accumulation_steps", "grpo.sync_ref_model", "grpo.lora"}


def as_override(value: Any) -> str:
    """`value` as the YAML text of a `key=value` override (flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = jaxcore.cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, out: str, err: str, *expected: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code not in (0, None), (code, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in out + err
    assert any(e in lines[0] for e in expected), (expected, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- config values, every field

@pytest.mark.parametrize("command,key,hint", [("es", k, h) for k, h in ES_FIELDS] +
                         [("grpo", k, h) for k, h in GRPO_FIELDS], ids=lambda v: v if isinstance(v, str) else "")
@PER_FIELD
@given(data=st.data())
def test_a_value_outside_a_fields_declaration_is_one_line(tmp_path, capsys, command, key, hint, data):
    decl = declaration(hint)
    if decl.base is Any or is_text_field(hint):             # a text field takes any override as its text
        return
    value = data.draw(invalid_values(decl), label="value")
    text = as_override(value)
    if not same(yaml.safe_load(text), value):
        return                                              # not expressible as an override
    out_dir = tmp_path / "out"
    code, out, err = run_cli(capsys, [command, f"model.path={tmp_path}/no-model", f"train.out_dir={out_dir}",
                                      f"{key}={text}"])
    line = assert_one_line(code, out, err, f"{key}=", f"{key}[")
    assert code == 2 and "must" in line, line
    assert not out_dir.exists()


@pytest.mark.parametrize("config,key,hint", [(ESConfig, k, h) for k, h in ES_FIELDS if k not in CROSS_FIELD] +
                         [(GRPOConfig, k, h) for k, h in GRPO_FIELDS if k not in CROSS_FIELD],
                         ids=lambda v: v if isinstance(v, str) else "")
@PER_FIELD
@given(data=st.data())
def test_a_value_inside_a_fields_declaration_loads(config, key, hint, data):
    decl = declaration(hint)
    if decl.base is Any:
        return
    value = data.draw(valid_values(decl), label="value")
    if is_text_field(hint) and value in YAML_NULLS:
        return                                              # null's spellings unset an optional text field
    text = value if is_text_field(hint) and isinstance(value, str) else as_override(value)   # text as typed
    cfg = load_config(config, None, [f"{key}={text}"])
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    assert node == value or (isinstance(value, float) and math.isclose(node, value))


def test_every_section_field_is_fuzzed():
    """The generated cases reach every field (a field added later is fuzzed without editing this file)."""
    keys = {k for k, _ in ES_FIELDS} | {k for k, _ in GRPO_FIELDS}
    assert {"es.population", "rollout.max_new_tokens", "train.epochs", "grpo.lora.rank", "mesh.model",
            "optimizer.adam_beta2", "rewards.timeout_s", "distributed.num_processes"} <= keys
    assert len(ES_FIELDS) > 50 and len(GRPO_FIELDS) > 70


# --------------------------------------------------------------------------- corruptions of every file read

def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def corrupt(data: bytes, kind: str, where: int) -> bytes:
    """`data` cut short, given bad UTF-8 bytes, or replaced by a JSON document of another type."""
    if kind == "truncate":
        return data[: where % max(len(data) - 1, 1)]
    if kind == "bad-bytes":
        cut = where % (len(data) + 1)
        return data[:cut] + b"\xff\xed\xa0\x80" + data[cut:]        # 0xff and an encoded lone surrogate
    return json.dumps(["not", "an", "object"][: where % 3] or None).encode()


CORRUPTIONS = st.tuples(st.sampled_from(["truncate", "bad-bytes", "wrong-type"]), st.integers(0, 10**6))


@pytest.fixture(scope="module")
def inputs(tiny_dir, tmp_path_factory) -> dict[str, Path]:
    """A valid copy of each file a command reads, in its own directory (a model directory, a checkpoint)."""
    import shutil

    import jaxcore
    from jaxcore.hf.model_checkpoint import save_model

    model, root = tiny_dir("llama"), tmp_path_factory.mktemp("inputs")
    shutil.copytree(model, root / "model")
    save_model(jaxcore.load_hf(model), root / "ckpt", tokenizer_dir=model)
    (root / "prompts.jsonl").write_text('{"prompt": "What is 2 + 2?"}\n{"prompt": "Name a colour."}\n')
    (root / "data.json").write_text(json.dumps([{"prompt": f"q{i}", "answer": str(i)} for i in range(6)],
                                               separators=(",", ":")))
    (root / "questions.json").write_text(json.dumps([["What is 12 plus 30?", "42"]], separators=(",", ":")))
    (root / "config.yaml").write_text("task:\n  name: addition\nes:\n  population: 4\n  sigma: 0.01\n")
    return {"root": root, "model": root / "model", "ckpt": root / "ckpt"}


# (file to corrupt, relative to the inputs' root; the command; what the one line may name besides the file
# when the damaged file happens to stay valid: the next check, e.g. the missing model)
FILE_CASES = {
    "config.json": ("model/config.json", ["plan", "model.path={root}/model"], ()),
    "tokenizer.json": ("model/tokenizer.json", ["generate", "--model", "{root}/model", "--prompt", "hi",
                                                "--max-new-tokens", "1"], ()),
    "jaxcore.json": ("ckpt/jaxcore.json", ["convert", "--to-hf", "{root}/ckpt", "--out", "{out}"], ()),
    "yaml": ("config.yaml", ["plan", "--config", "{root}/config.yaml", "model.path={root}/missing"],
             ("missing", ": must be ", "unknown config key")),
    "prompts": ("prompts.jsonl", ["generate", "--model", "{root}/missing", "--prompts-file", "{root}/prompts.jsonl"],
                ("missing",)),
    "dataset": ("data.json", ["es", "model.path={root}/model", "task.name=file",
                              "task.options={{path: {root}/data.json}}", "train.out_dir={out}"], ()),
    "questions": ("questions.json", ["rft-datagen", "--model", "{root}/model", "--questions", "{root}/questions.json",
                                     "--out", "{out}"], ()),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
@FUZZ
@given(corruption=CORRUPTIONS)
def test_a_corrupted_input_file_is_one_line(inputs, tmp_path_factory, capsys, case, corruption):
    import torchref.cli

    relative, argv, fallback = FILE_CASES[case]
    root = inputs["root"]
    file = root / relative
    original = file.read_bytes()
    damaged = corrupt(original, *corruption)
    out = tmp_path_factory.mktemp("out") / "o"
    try:
        file.write_bytes(damaged)
        before = digest(root)
        args = [a.format(root=root, out=out) for a in argv]
        capsys.readouterr()
        try:
            code = (torchref.cli if case == "questions" else jaxcore.cli).main(args)
        except SystemExit as exit_:
            code = exit_.code
        captured = capsys.readouterr()
        assert_one_line(code, captured.out, captured.err, Path(relative).name, *fallback)
        assert digest(root) == before                              # inputs unchanged
        assert not out.exists() or not digest(out)                  # nothing written (a run's lock may leave
                                                                    # its empty out_dir)
    finally:
        file.write_bytes(original)


# --------------------------------------------------------------------------- the Python API (item 11)

@pytest.mark.parametrize("trainer", ["ESTrainer", "GRPOTrainer"])
@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_api_refuses_a_bad_setting_before_any_work(trainer, data):
    import jaxcore

    trainer_type = getattr(jaxcore, trainer)
    fields = ES_FIELDS if trainer == "ESTrainer" else GRPO_FIELDS
    key, hint = data.draw(st.sampled_from([(k, h) for k, h in fields if k != "model.path"]), label="key")
    value = data.draw(invalid_values(declaration(hint)), label="value")
    args = trainer_type.config_type()
    *path, name = key.split(".")
    node = args
    for part in path:
        node = getattr(node, part)
        if node is None:                                   # an optional section not set: set it first
            return
    setattr(node, name, value)
    with pytest.raises((TypeError, ValueError)) as raised:
        trainer_type(model="unused-model-dir", args=args)
    assert f"args.{key}" in str(raised.value)


def test_api_wrong_argument_types_name_the_parameter():
    from jaxcore import ESConfig, ESTrainer

    args = ESConfig()
    args.es.population = "4"
    with pytest.raises(TypeError, match=r"args\.es\.population='4': must be an integer"):
        ESTrainer(model="m", args=args)
    with pytest.raises(TypeError, match=r"reward_funcs\[1\] must be a callable"):
        ESTrainer(model="m", reward_funcs=[len, 3])
    with pytest.raises(TypeError, match="reward_funcs must be"):
        ESTrainer(model="m", reward_funcs=42)
    with pytest.raises(TypeError, match="model must be a path or a loaded"):
        ESTrainer(model=3.5)
    with pytest.raises(TypeError, match="train_dataset must be a path"):
        ESTrainer(model="m", train_dataset=7)
    with pytest.raises(TypeError, match="args must be a ESConfig"):
        ESTrainer(model="m", args={"es": {}})
    trainer = ESTrainer(model="m")
    trainer.args.train.epochs = -1                          # edited after construction: train() checks again
    with pytest.raises(ValueError, match=r"args\.train\.epochs=-1: must be >= 1"):
        trainer.train()


# --------------------------------------------------------------------------- the backstop (item 12)

@pytest.mark.parametrize("cli", ["jaxcore", "torchref"])
def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys, cli):
    import jaxcore.commands.plan
    import torchref.cli
    import torchref.commands.rft_data

    def broken(args):
        raise ZeroDivisionError("a bug\nsecond line")

    module, argv = ((jaxcore.commands.plan, ["plan"]) if cli == "jaxcore"
                    else (torchref.commands.rft_data, ["rft-data", "--out", "unused"]))
    monkeypatch.setattr(module, "run", broken)
    main = jaxcore.cli.main if cli == "jaxcore" else torchref.cli.main
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"{cli}: error: unexpected ZeroDivisionError: a bug (rerun with --debug for the "
                                "traceback)"]
    with pytest.raises(ZeroDivisionError):
        main(["--debug", *argv])
