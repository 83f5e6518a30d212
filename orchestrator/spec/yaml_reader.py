"""Reading a sweep spec: YAML (guarded against alias bombs, deep nesting and duplicate keys),
shipped names, and pydantic errors reduced to one line naming the field."""

from __future__ import annotations

import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.spec.sweep_spec import SpecError, SweepSpec

__all__ = ["load_spec", "load_spec_data", "spec_from_dict", "spec_from_text", "data_from_text",
           "format_validation_error",
           "MAX_SPEC_BYTES", "MAX_YAML_NODES"]

MAX_SPEC_BYTES = 1_000_000
MAX_YAML_NODES = 100_000  # after alias expansion: a billion-laughs file is refused
MAX_YAML_DEPTH = 64


# --- errors --------------------------------------------------------------------------------


def _model_at(path: list[Any]) -> type[BaseModel] | None:
    """The pydantic model class found by walking ``path`` (field names, dict keys) from the root."""
    cur: Any = SweepSpec
    i = 0
    while i < len(path):
        is_model = isinstance(cur, type) and issubclass(cur, BaseModel)
        if not is_model or path[i] not in cur.model_fields:
            return None
        ann = cur.model_fields[path[i]].annotation
        if typing.get_origin(ann) in (typing.Union, types.UnionType):
            ann = next(a for a in typing.get_args(ann) if a is not type(None))
        if typing.get_origin(ann) is dict:
            ann = typing.get_args(ann)[1]
            i += 1  # skip the dict key
        cur = ann
        i += 1
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def format_validation_error(exc: ValidationError) -> str:
    """The first error as one line: ``dotted.field: what is wrong / what is valid``."""
    err = exc.errors(include_url=False)[0]
    # drop pydantic's union/function tags ("function-after[...]", "literal['a']") from the path
    loc = [p for p in err["loc"] if isinstance(p, int) or "[" not in p]
    parts = [str(p) for p in loc if not isinstance(p, int)]
    where = ".".join(parts) + "".join(f"[{p}]" for p in loc[len(parts):] if isinstance(p, int))
    msg = err["msg"].removeprefix("Value error, ")
    kind, got = err["type"], err.get("input")
    if kind == "extra_forbidden":
        model = _model_at([str(p) for p in loc[:-1]])
        valid = ", ".join(model.model_fields) if model else ""
        text = f"unknown field; valid: {valid}" if valid else "unknown field"
    elif kind == "missing":
        text = "required field is missing"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = f"expected a mapping, got {_short(got)}"
    elif kind == "value_error":
        text = msg
    else:
        text = f"{msg}, got {_short(got)}"
    text = " ".join(text.split())
    return f"{where}: {text}" if where else text


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


# --- YAML ----------------------------------------------------------------------------------


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs, cyclic aliases, deep nesting and duplicate keys,
    and reads ``1e-3`` as a float (YAML 1.1 needs ``1.0e-3``; users write both)."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _walk(node, {}, set(), 0)
        return node


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _walk(node: yaml.Node, memo: dict[int, int], active: set[int], depth: int) -> int:
    """Expanded node count (aliases counted every time they are used), memoised per node."""
    if id(node) in memo:
        return memo[id(node)]
    if id(node) in active:
        raise SpecError("spec: recursive YAML alias")
    if depth > MAX_YAML_DEPTH:
        raise SpecError(f"spec: YAML nested deeper than {MAX_YAML_DEPTH} levels")
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
        dup = next((k for k in keys if keys.count(k) > 1 and k != "<<"), None)
        if dup is not None:
            raise SpecError(f"spec: duplicate key {dup!r} at line {node.start_mark.line + 1}")
        children = [c for kv in node.value for c in kv]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    n = 1 + sum(_walk(c, memo, active, depth + 1) for c in children)
    if n > MAX_YAML_NODES:
        raise SpecError(f"spec: YAML expands to more than {MAX_YAML_NODES} nodes "
                        "(an alias bomb?); refusing")
    active.discard(id(node))
    memo[id(node)] = n
    return n


def spec_from_text(text: str | bytes, source: str = "spec") -> SweepSpec:
    """Parse and validate YAML text (at most ``MAX_SPEC_BYTES``)."""
    return spec_from_dict(data_from_text(text, source))


def data_from_text(text: str | bytes, source: str = "spec") -> Any:
    """The guarded YAML parse of a spec, not yet validated."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: {size} bytes is larger than the {MAX_SPEC_BYTES} byte limit")
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{source}: invalid YAML{at}: {e.problem or e.context}") from None
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError) as e:
        raise SpecError(f"{source}: invalid YAML: {type(e).__name__}") from None
    return data


def spec_from_dict(data: Any) -> SweepSpec:
    if not isinstance(data, dict):
        raise SpecError(f"spec: the top level must be a mapping of sections, got "
                        f"{type(data).__name__}")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e)) from None


def load_spec(name_or_path: str | os.PathLike) -> SweepSpec:
    """A shipped spec by bare name (``quickstart``) or a YAML file by path."""
    return spec_from_dict(load_spec_data(name_or_path))


def load_spec_data(name_or_path: str | os.PathLike) -> Any:
    """The parsed YAML of ``load_spec``'s spec, before validation (``--set`` edits it)."""
    from search_spaces import list_specs, spec_path

    text = str(name_or_path)
    is_path = (isinstance(name_or_path, os.PathLike) or os.sep in text or "/" in text
               or text.endswith((".yaml", ".yml")) or Path(text).is_file())
    if is_path:
        path = Path(text).expanduser()
        if not path.is_file():
            raise SpecError(f"spec: no such file {text!r}")
    else:
        if text not in list_specs():
            raise SpecError(f"spec: {text!r} is neither a file nor a shipped spec; shipped: "
                            f"{', '.join(list_specs())}")
        path = spec_path(text)
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"{path.name}: {size} bytes is larger than the {MAX_SPEC_BYTES} byte limit")
    return data_from_text(path.read_bytes(), source=path.name)
