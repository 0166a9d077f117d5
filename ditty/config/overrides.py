"""Command-line overrides: `--section.field VALUE` on top of a loaded recipe.

Values are written as in TOML (`--train.compile false`, `--optimizer.lr 1e-4`,
`--peft.target_modules '["q_proj","v_proj"]'`, `--model.config '{hidden_size = 128}'`, which replaces
the whole table, or `--model.config.hidden_size 128`, which sets one entry of it); a value that is
not valid TOML is taken as a bare string (`--run.name demo`). Of a flag given twice, the last wins.
Each value is checked by the same strict converter as the TOML loader, so a flag error reads like a
recipe error. tyro then
builds the new config from the checked values (it also renders `--help` from the docstrings).
tyro cannot express free-form tables, arrays of tables (`model.config`, `pipeline.loss`) or a
one-item list where a string would also do, so those few values are set directly.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

import tomllib

from ditty.config.aliases import foreign_key_fix, moved_key
from ditty.config.coerce import MISSING, convert_or_report
from ditty.config.errors import Problem, RecipeError
from ditty.config.loader import LoadedRecipe
from ditty.config.schema import FieldInfo, is_config_class, walk_leaves

FLAG_SOURCE = "command line"


def parse_flag_value(text: str) -> Any:
    """A flag's value read as a TOML value; anything that is not TOML is a plain string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def split_flags(argv: list[str], switches: frozenset[str] = frozenset()) -> tuple[list[tuple[str, str]], list[Problem]]:
    """`["--a.b", "1", "--c.d=x"]` -> [("a.b", "1"), ("c.d", "x")].

    A boolean field in `switches` may also stand alone as a switch (`--train.compile` means true).
    """
    pairs: list[tuple[str, str]] = []
    problems: list[Problem] = []
    position = 0
    while position < len(argv):
        token = argv[position]
        if not token.startswith("--"):
            problems.append(
                Problem("", f"unexpected argument {token!r}", fix="overrides look like --section.field VALUE")
            )
            position += 1
            continue
        name, equals, value = token[2:].partition("=")
        name = name.replace("-", "_")
        next_is_flag = position + 1 >= len(argv) or argv[position + 1].startswith("--")
        if not equals and name in switches and next_is_flag:
            value = "true"
        elif not equals:
            if position + 1 >= len(argv):
                problems.append(Problem(name, f"flag --{name} has no value", fix=f"write --{name} VALUE"))
                break
            value = argv[position + 1]
            position += 1
        pairs.append((name, value))
        position += 1
    return pairs, problems


def apply_overrides(loaded: LoadedRecipe, argv: list[str]) -> LoadedRecipe:
    if not argv:
        return loaded
    schema = type(loaded.config)
    leaves = {leaf.path: leaf for leaf in walk_leaves(schema)}
    switches = frozenset(path for path, leaf in leaves.items() if leaf.type is bool)
    pairs, problems = split_flags(argv, switches)
    checked: dict[str, Any] = {}
    moved = dict(loaded.moved)
    for path, text in pairs:  # a flag given again wins over the earlier one: scripts append overrides
        current = moved_key(path)
        if current is not None:  # an old name (ditty.config.aliases): the compiler warns of it
            moved[current] = f"--{path}"
            path = current
        leaf = leaves.get(path)
        table = _table_of(path, leaves) if leaf is None else None
        if table is not None:  # --model.config.hidden_size 64: one entry of a table field
            table_path, entry = table
            current = checked.get(table_path, _value_at(loaded.config, table_path))
            merged = _with_entry(dict(current or {}), entry, parse_flag_value(text))
            value = convert_or_report(merged, leaves[table_path].type, table_path, problems, schema)
            if value is not MISSING:
                checked[table_path] = value
            continue
        if leaf is None:
            problems.append(_unknown_flag(path, leaves))
            continue
        value = convert_or_report(parse_flag_value(text), leaf.type, path, problems, schema)
        if value is not MISSING:
            checked[path] = value
    if problems:
        raise RecipeError(problems, source=FLAG_SOURCE)
    by_tyro = {p: v for p, v in checked.items() if _tyro_can_parse(leaves[p], v)}
    config = _build_with_tyro(loaded.config, by_tyro)
    for path, value in checked.items():
        if path not in by_tyro:
            config = replace_path(config, path, value)
    provenance = dict(loaded.provenance)
    provenance.update({path: "flag" for path in checked})
    return dataclasses.replace(loaded, config=config, provenance=provenance, moved=moved)


def _table_of(path: str, leaves: dict[str, FieldInfo]) -> tuple[str, list[str]] | None:
    """(the table field, the entry's keys in it) when `path` goes on past a field that is a free
    table (`model.config.hidden_size`: model.config, ["hidden_size"]), else None."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        leaf = leaves.get(".".join(parts[:cut]))
        if leaf is not None:
            return (leaf.path, parts[cut:]) if typing.get_origin(leaf.type) is dict else None
    return None


def _value_at(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def _with_entry(table: dict, keys: list[str], value: Any) -> dict:
    """`table` with the entry at `keys` set (tables on the way made or copied, never changed in place)."""
    head, rest = keys[0], keys[1:]
    if rest:
        inner = table.get(head)
        value = _with_entry(dict(inner) if isinstance(inner, dict) else {}, rest, value)
    return {**table, head: value}


def replace_path(config: Any, path: str, value: Any) -> Any:
    """A copy of a frozen config tree with one dotted field changed."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: replace_path(getattr(config, head), rest, value)})


def _build_with_tyro(default: Any, values: dict[str, Any]) -> Any:
    import tyro

    args: list[str] = []
    for path, value in values.items():
        tokens = _tyro_tokens(value)
        # `--key=value` keeps values such as "-1" from reading as flags.
        args.extend(
            [f"--{path}={tokens[0]}"]
            if len(tokens) == 1 and not isinstance(value, (list, tuple))
            else [f"--{path}", *tokens]
        )
    return tyro.cli(type(default), args=args, default=default, config=(tyro.conf.FlagConversionOff,))


def _tyro_tokens(value: Any) -> list[str]:
    if value is None:
        return ["None"]
    if isinstance(value, (list, tuple)):
        return [token for item in value for token in _tyro_tokens(item)]
    return [str(value)]


def tyro_handles(tp: Any) -> bool:
    """tyro handles scalars, Literals and lists of scalars; not free tables or lists of tables."""
    origin = typing.get_origin(tp)
    if origin is dict or is_config_class(tp) or tp is Any:
        return False
    if origin in (typing.Union, types.UnionType) and any(typing.get_origin(a) is list for a in typing.get_args(tp)):
        return False  # tyro reads a one-item list for `str | list[str]` as the string
    return all(
        tyro_handles(arg) for arg in typing.get_args(tp) if arg is not Ellipsis and not isinstance(arg, (str, int))
    )


def _tyro_can_parse(leaf: FieldInfo, value: Any) -> bool:
    """Whether tyro can take this value: its type, and an argv token that carries it intact.

    List items that are empty or start with "-" read as flags, and a string "None" reads as
    null, so such values are set directly.
    """

    def safe(item: Any) -> bool:
        if isinstance(item, (list, tuple)):
            return all(safe(i) and not (isinstance(i, str) and (not i or i.startswith("-"))) for i in item)
        return not (isinstance(item, str) and item in ("None", "True", "False"))

    return tyro_handles(leaf.type) and safe(value)


def _unknown_flag(path: str, leaves: dict[str, FieldInfo]) -> Problem:
    close = difflib.get_close_matches(path, list(leaves), n=1, cutoff=0.6)
    if not close:
        tail = path.rsplit(".", 1)[-1]
        close = [p for p in leaves if p.rsplit(".", 1)[-1] == tail][:1]
    fix = f"did you mean --{close[0]}?" if close else "see `ditty run --help` for every flag"
    fix = foreign_key_fix(path.rsplit(".", 1)[-1], flag=True) or fix
    return Problem(path, f"unknown flag --{path}", fix=fix)
