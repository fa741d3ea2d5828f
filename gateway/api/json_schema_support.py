"""Which JSON Schema keywords a constrained answer follows: the one allow-list, and its check.

The grammar backend (xgrammar 0.2.9) enforces some keywords and silently ignores others; an
ignored keyword would let an answer break the schema the client gave. So every schema a request
gives (`response_format.json_schema.schema`, `structured_outputs.json`, each tool's
`parameters`) is checked here first: each keyword is either enforced by the grammar
(`ENFORCED`), an annotation that no answer can break (`ANNOTATIONS`), or refused with a 400 that
names the body field, the keyword and its JSON path (`REFUSED`). The lists were found by
experiment (sampling the compiled grammar and validating with `jsonschema`), not guessed;
docs/structured-outputs.md has the table.

Names that are not JSON Schema keywords at all (`x-foo`, a vendor's extension) are ignored by the
grammar and by every validator alike, so they are accepted as annotations.

References must be local (`#`, `#/$defs/...`, `#/definitions/...`, any JSON pointer into the same
document) and must resolve; a remote `$ref` is refused. `relocate_refs` moves a schema under a
bigger one (a tool's parameters inside the tool-call grammar) and rewrites its references so they
still resolve.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

from weir.gateway.http.errors import BadRequestError

# Keywords the grammar enforces, as long as `check_schema`'s extra rules hold (below).
ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",  # only when its branches cannot overlap
        "allOf",  # only with a single member
        "$ref",  # local only
        "$defs",
        "definitions",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",  # not together with `pattern`
        "maxLength",  # not together with `pattern`
        "pattern",
        "minItems",
        "maxItems",
        "format",  # date, time, date-time, uuid, ... enforced; others are annotations to validators too
        "uniqueItems",  # only `false`
        "unevaluatedProperties",  # only `false` (the grammar admits no property it does not list)
    }
)
# Keywords no answer can break.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "examples",
        "default",
        "$schema",
        "$id",
        "$comment",
        "$vocabulary",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "discriminator",  # OpenAPI's hint beside a `oneOf`; the oneOf rule does the work
        "nullable",  # OpenAPI's; JSON Schema validators ignore it, the grammar never writes null for it
        "strict",
    }
)
# JSON Schema keywords the grammar does not enforce (measured: answers broke them).
REFUSED = frozenset(
    {
        "multipleOf",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "if",
        "then",
        "else",
        "not",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedItems",
        "additionalItems",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
    }
)
# `format` values the grammar writes wrongly (measured: ipv4 admits leading zeros, "04.1.2.3").
REFUSED_FORMATS = frozenset({"ipv4", "ipv6"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMAS = ("items", "additionalProperties", "unevaluatedProperties")
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_REF_HOPS = 32  # a chain of `$ref`s to `$ref`s followed when comparing oneOf branches


def _refuse(param: str, path: str, what: str) -> BadRequestError:
    return BadRequestError(f"'{param}' {what} at {path}", param=param, code="unsupported_schema")


def _value_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def resolve_pointer(document: Any, ref: str) -> Any:
    """The node a local `$ref` (`#` or `#/a/b`) points at in `document`; KeyError if none."""
    if ref == "#":
        return document
    if not ref.startswith("#/"):
        raise KeyError(ref)
    node = document
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(ref)
    return node


def _walk(node: Any, path: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object in `node` (subschemas too), with its JSON path; not through `$ref`."""
    stack = [(node, path)]
    while stack:
        schema, here = stack.pop()
        if not isinstance(schema, dict):
            continue
        yield schema, here
        for key in _SCHEMA_MAPS:
            members = schema.get(key)
            if isinstance(members, dict):
                stack.extend((v, f"{here}.{key}.{name}") for name, v in members.items())
        for key in _SCHEMA_LISTS:
            members = schema.get(key)
            if isinstance(members, list):
                stack.extend((v, f"{here}.{key}[{i}]") for i, v in enumerate(members))
        for key in _SUBSCHEMAS:
            if key in schema:
                stack.append((schema[key], f"{here}.{key}"))


def check_schema(schema: Any, param: str, path: str = "$") -> None:
    """Refuse (400 naming `param`, the keyword and its path) what the grammar would not enforce."""
    if not isinstance(schema, dict | bool):
        raise _refuse(param, path, "is not a JSON Schema (an object or a boolean)")
    for node, here in _walk(schema, path):
        _check_node(node, here, schema, param)


def _check_node(node: dict[str, Any], here: str, document: Any, param: str) -> None:
    for key in node:
        if key in REFUSED:
            raise _refuse(param, here, f"uses the JSON Schema keyword '{key}', which is not enforced")
    for key in _SCHEMA_MAPS:
        if key in node and not isinstance(node[key], dict):
            raise _refuse(param, f"{here}.{key}", "must be an object of schemas")
    for key in _SCHEMA_LISTS:
        if key in node and not (isinstance(node[key], list) and node[key]):
            raise _refuse(param, f"{here}.{key}", "must be a non-empty list of schemas")
    if node.get("uniqueItems", False) is not False:
        raise _refuse(param, here, "uses the JSON Schema keyword 'uniqueItems' (only false is enforced)")
    if node.get("unevaluatedProperties", False) is not False:
        raise _refuse(
            param, here, "uses the JSON Schema keyword 'unevaluatedProperties' (only false is enforced)"
        )
    if node.get("format") in REFUSED_FORMATS:
        raise _refuse(
            param,
            here,
            f"uses the JSON Schema keyword 'format' with {node['format']!r}, which is not enforced",
        )
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        raise _refuse(
            param,
            here,
            "combines the JSON Schema keyword 'pattern' with 'minLength'/'maxLength', which is not "
            "enforced (put the length in the pattern)",
        )
    if "allOf" in node and len(node["allOf"]) != 1:
        raise _refuse(param, here, "uses the JSON Schema keyword 'allOf' with more than one schema")
    _check_type(node, here, param)
    _check_required(node, here, param)
    if "$ref" in node:
        _check_ref(node, here, document, param)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            _check_alone(node, key, here, param)
    if "oneOf" in node and not _disjoint(node["oneOf"], document):
        raise _refuse(
            param,
            here,
            "uses the JSON Schema keyword 'oneOf' with branches that may overlap (only anyOf is "
            "enforced there; oneOf needs branches of different types or a distinct const property)",
        )


def _check_type(node: dict[str, Any], here: str, param: str) -> None:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            raise _refuse(param, f"{here}.type", f"names an unknown type {k!r}")


def _check_required(node: dict[str, Any], here: str, param: str) -> None:
    required = node.get("required")
    if required is None:
        return
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _refuse(param, f"{here}.required", "must be a list of property names")
    properties = node.get("properties")
    listed = properties if isinstance(properties, dict) else {}
    for name in required:
        if name not in listed:
            raise _refuse(
                param,
                f"{here}.required",
                f"requires the property {name!r}, which 'properties' does not declare (not enforced)",
            )


def _check_ref(node: dict[str, Any], here: str, document: Any, param: str) -> None:
    ref = node["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise _refuse(
            param, f"{here}.$ref", f"refers to {ref!r}: only local references ('#/$defs/...') are supported"
        )
    try:
        resolve_pointer(document, ref)
    except KeyError:
        raise _refuse(param, f"{here}.$ref", f"refers to {ref!r}, which is not in the schema") from None
    _check_alone(node, "$ref", here, param)


def _check_alone(node: dict[str, Any], key: str, here: str, param: str) -> None:
    """`$ref`, anyOf, oneOf and allOf take only annotations beside them (the grammar drops the rest)."""
    for other in node:
        if other != key and other not in ANNOTATIONS and other not in ("$defs", "definitions"):
            if other in ENFORCED:
                raise _refuse(
                    param,
                    here,
                    f"uses the JSON Schema keyword '{other}' beside '{key}', which is not enforced "
                    f"(move it into the referenced or combined schemas)",
                )


def _resolved(schema: Any, document: Any) -> Any:
    for _ in range(MAX_REF_HOPS):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema
        try:
            schema = resolve_pointer(document, schema["$ref"])
        except KeyError:
            return None
    return None


def _types(schema: Any, document: Any, hops: int = 0) -> frozenset[str] | None:
    """The JSON types `schema` can produce, or None when unknown."""
    schema = _resolved(schema, document)
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return frozenset({_value_type(schema["const"])})
    if isinstance(schema.get("enum"), list):
        return frozenset(_value_type(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, list):
        return frozenset(k for k in kind if isinstance(k, str))
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and hops < MAX_REF_HOPS:
        found: set[str] = set()
        for branch in branches:
            sub = _types(branch, document, hops + 1)
            if sub is None:
                return None
            found |= sub
        return frozenset(found)
    return None


def _overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    widen = {"integer": {"integer", "number"}, "number": {"integer", "number"}}
    wide_a = set().union(*(widen.get(t, {t}) for t in a)) if a else set()
    return bool(wide_a & b)


def _tags(schema: Any, document: Any, name: str) -> list[Any] | None:
    """The values a required property `name` of an object schema may take, if fixed (const/enum)."""
    schema = _resolved(schema, document)
    if not isinstance(schema, dict) or name not in (schema.get("required") or ()):
        return None
    prop = _resolved((schema.get("properties") or {}).get(name), document)
    if not isinstance(prop, dict):
        return None
    if "const" in prop:
        return [prop["const"]]
    enum = prop.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _disjoint(branches: list[Any], document: Any) -> bool:
    """Whether no JSON value can match two of `branches` (what makes oneOf the same as anyOf)."""
    types = [_types(b, document) for b in branches]
    if all(t is not None for t in types):
        known = [t for t in types if t is not None]
        if all(not _overlap(a, b) for i, a in enumerate(known) for b in known[i + 1 :]):
            return True
    first = _resolved(branches[0], document)
    candidates = (first.get("required") or []) if isinstance(first, dict) else []
    for name in candidates if isinstance(candidates, list) else []:
        tags = [_tags(b, document, name) for b in branches]
        if any(t is None for t in tags):
            continue
        seen: list[Any] = []
        clash = False
        for values in tags:
            for v in values or ():
                if any(v == s and type(v) is type(s) for s in seen):
                    clash = True
            seen.extend(values or ())
        if not clash:
            return True
    return False


def relocate_refs(schema: Any, pointer: str) -> Any:
    """`schema` with its local `$ref`s rewritten as if it sat at `pointer` (`#/$defs/x`) in a bigger
    document: `#` becomes `pointer`, `#/$defs/City` becomes `pointer + "/$defs/City"`. A copy; the
    input is untouched. Only `$ref` values inside schema positions are rewritten."""
    if isinstance(schema, list):
        return [relocate_refs(v, pointer) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = pointer + value[1:]
        elif key in ("enum", "const", "default", "examples"):
            out[key] = value  # values, not schemas: a "$ref" key in them is data
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: relocate_refs(v, pointer) for name, v in value.items()}
        else:
            out[key] = relocate_refs(value, pointer)
    return out
