"""Loading a recipe: a TOML file (or a bundled recipe's name) into a frozen config tree.

The loader is strict: unknown keys, wrong types and bad files are `RecipeError`s that name the
dotted key, the TOML line and a fix, and every problem in a file is reported at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from ditty.config import coerce
from ditty.config.aliases import move_keys
from ditty.config.bundled import find_bundled
from ditty.config.errors import Problem, RecipeError
from ditty.config.errors import error as error_problem
from ditty.config.lines import LineIndex, index_lines
from ditty.config.references import import_reference, resolve_reference
from ditty.config.root import TrainerConfig
from ditty.config.schema import is_config_class, walk_leaves
from ditty.config.toml_errors import explain as explain_toml_error

TRAINER_KEY = "trainer"
"""Top-level key naming a Trainer subclass whose `Config` is the schema of the whole file."""

MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of text; anything larger is not one


@dataclass(frozen=True)
class LoadedRecipe:
    config: Any
    """The frozen config tree (a `TrainerConfig` or the named trainer's subclass of it)."""
    source: str | None = None
    """Where it came from: a file path, or None when built in code."""
    trainer: str | None = None
    """The `trainer = "pkg.mod:Class"` reference, when the recipe names one."""
    provenance: dict[str, str] = field(default_factory=dict)
    """Dotted leaf path -> "default", "toml" or "flag"."""
    lines: LineIndex = field(default_factory=LineIndex)
    moved: dict[str, str] = field(default_factory=dict)
    """Keys written by an old name (ditty.config.aliases.MOVED_KEYS): new dotted key -> the old one, or
    "--old.key" for a flag. The compiler warns of each; problems of a moved key point at its old line."""


def resolve_recipe_path(ref: str) -> Path:
    """A path to a file, or the name of a bundled recipe."""
    path = Path(ref)
    if path.exists():
        if path.is_dir():
            raise RecipeError.single(f"{ref} is a directory, not a recipe file", fix="name a .toml file")
        return path
    bundled = find_bundled(ref)
    if bundled is not None:
        return bundled
    raise RecipeError.single(
        f"no recipe file or bundled recipe named {ref!r}",
        fix="give a path to a .toml file, or a name from `ditty ls`",
    )


def load_recipe(ref: str) -> LoadedRecipe:
    path = resolve_recipe_path(ref)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise RecipeError.single(
            f"cannot read {path}: {error.strerror}", fix="check the path and permissions"
        ) from None
    return parse_recipe(raw, source=str(path))


def parse_recipe(raw: bytes | str, source: str | None = None, *, import_code: bool = True) -> LoadedRecipe:
    """The recipe in `raw`. `import_code=False` reads a recipe someone else wrote (a run directory's):
    its `trainer` module is not imported, and the sections that trainer's Config would add are left
    out (readers of a run need only ditty's own)."""
    text = _decode(raw, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        # A key set twice, or a key that breaks TOML's rules, is said in the user's words (toml_errors).
        raise RecipeError([explain_toml_error(error, text)], source=source) from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise RecipeError.single(
            "arrays or inline tables are nested too deeply to read",
            fix="a recipe nests a few levels at most; check for a run of [ or { that is not closed as intended",
            source=source,
        ) from None
    if not data:
        raise RecipeError.single("the recipe is empty", fix="start from `ditty init -o recipe.toml`", source=source)
    lines = index_lines(text)
    problems: list[Problem] = []
    moved, clashes = move_keys(data)
    for old_key, new_key in clashes:
        problems.append(
            error_problem(old_key, f"and {new_key} are one key (its old and its new name), both set", f"keep {new_key}")
        )
    for new_key, old_key in moved.items():  # a moved key's problems point at the line it was written on
        if old_key in lines.lines:
            lines.lines[new_key] = lines.lines[old_key]
    trainer_ref = data.pop(TRAINER_KEY, None)
    schema = TrainerConfig
    if trainer_ref is not None and not import_code:
        known = {f.name for f in dataclasses.fields(TrainerConfig)}
        data = {name: value for name, value in data.items() if name in known}
    elif trainer_ref is not None:
        schema = _trainer_schema(trainer_ref, problems)
    config = coerce.build(schema, data, problems)
    problems = [_with_line(p, lines) for p in problems]
    if problems:
        raise RecipeError(problems, source=source)
    return LoadedRecipe(
        config=config,
        source=source,
        trainer=trainer_ref,
        provenance=_provenance(schema, data),
        lines=lines,
        moved=moved,
    )


def from_config(config: Any, trainer: str | None = None) -> LoadedRecipe:
    """Wrap a config built in code (Python recipes, the Pipeline API): every value is a default."""
    return LoadedRecipe(
        config=config, trainer=trainer, provenance={leaf.path: "default" for leaf in walk_leaves(type(config))}
    )


def _decode(raw: bytes | str, source: str | None) -> str:
    if isinstance(raw, str):
        return raw
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError.single(
            f"is {len(raw)} bytes, too large for a recipe",
            source=source,
            fix="a recipe is a small TOML file; check that you named the right file",
        )
    if b"\x00" in raw:
        raise RecipeError.single("is a binary file, not a TOML recipe", source=source, fix="name a .toml text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecipeError.single(
            f"is not UTF-8 text (byte {error.start})", source=source, fix="save the recipe as UTF-8"
        ) from None


def _with_line(problem: Problem, lines: LineIndex) -> Problem:
    if problem.line is not None or not problem.key:
        return problem
    from dataclasses import replace

    return replace(problem, line=lines.line_of(problem.key))


def _trainer_schema(ref: Any, problems: list[Problem]) -> type:
    """The `Config` of the trainer class a recipe names; TrainerConfig when it cannot be used."""
    if not isinstance(ref, str) or ":" not in ref:
        problems.append(
            Problem(
                TRAINER_KEY,
                f'must be "package.module:TrainerClass", got {ref!r}',
                fix='for example trainer = "my_experiments.trainer:MyTrainer"',
            )
        )
        return TrainerConfig
    trainer, found = resolve_reference(ref, key=TRAINER_KEY)
    if found:
        problems.extend(found)
        return TrainerConfig
    schema = getattr(trainer, "Config", None)
    if not (is_config_class(schema) and issubclass(schema, TrainerConfig)):
        problems.append(
            Problem(
                TRAINER_KEY,
                f"{ref} has no `Config` dataclass that extends Trainer.Config",
                fix="subclass ditty.train.Trainer and its nested Config",
            )
        )
    else:
        return schema
    return TrainerConfig


def _provenance(schema: type, data: dict) -> dict[str, str]:
    provenance = {}
    for leaf in walk_leaves(schema):
        node: Any = data
        for part in leaf.path.split("."):
            node = node.get(part, coerce.MISSING) if isinstance(node, dict) else coerce.MISSING
        provenance[leaf.path] = "default" if node is coerce.MISSING else "toml"
    return provenance


def load_python_recipe(ref: str) -> LoadedRecipe:
    """`package.module:NAME`: a Trainer subclass (its Config's defaults), a Trainer.Config (a class or
    an instance), or a function returning one (a config registry, torchtitan style).

    What NAME is gets checked before anything is called: a function must be written in Python, take
    no required argument, and, when annotated, return a Trainer.Config; anything else (`os:abort`)
    is a RecipeError that never calls it."""
    obj = import_reference(ref, key="")  # the recipe itself, not a key inside one
    trainer = None
    if isinstance(obj, TrainerConfig):
        config = obj
    elif isinstance(obj, type) and issubclass(obj, TrainerConfig):
        config = _call_user_code(ref, obj)
    elif (
        isinstance(obj, type)
        and is_config_class(getattr(obj, "Config", None))
        and issubclass(obj.Config, TrainerConfig)
    ):
        config, trainer = _call_user_code(ref, obj.Config), f"{obj.__module__}:{obj.__qualname__}"
    else:
        _check_recipe_function(ref, obj)
        config = _call_user_code(ref, obj)
        if not isinstance(config, TrainerConfig):
            raise RecipeError.single(
                f"{ref} returned {type(config).__name__}, not a Trainer.Config",
                fix="return ditty.train.Trainer.Config(...) or a subclass's Config",
            )
    qualname = type(config).__qualname__
    if trainer is None and qualname.endswith(".Config") and type(config) is not TrainerConfig:
        trainer = f"{type(config).__module__}:{qualname.rsplit('.', 1)[0]}"
    loaded = from_config(config, trainer=trainer)
    return replace_source(loaded, ref)


_RECIPE_KINDS = "a Trainer subclass, a Trainer.Config, or a function returning one"


def _check_recipe_function(ref: str, obj: Any) -> None:
    """RecipeError unless `obj` can be a function returning a Trainer.Config; nothing is called."""
    import inspect

    if not inspect.isfunction(obj):  # builtins (os.abort), classes, modules, other objects
        what = "a built-in function" if inspect.isbuiltin(obj) else f"a {type(obj).__name__}"
        raise RecipeError.single(
            f"{ref} is {what}, not {_RECIPE_KINDS}; it was not called",
            fix="name a recipe function written in Python, e.g. my_recipes:tiny returning Trainer.Config(...)",
        )
    try:
        signature = inspect.signature(obj, eval_str=True)
    except (NameError, TypeError, ValueError, SyntaxError):  # an annotation that does not evaluate
        signature = inspect.signature(obj)
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise RecipeError.single(
            f"{ref} takes required arguments ({', '.join(required)}); a recipe function takes none. It was not called",
            fix="name a function with no required arguments that returns a Trainer.Config",
        )
    returns = signature.return_annotation
    if isinstance(returns, type) and not issubclass(returns, TrainerConfig):
        raise RecipeError.single(
            f"{ref} is annotated to return {returns.__name__}, not a Trainer.Config; it was not called",
            fix="name a function that returns ditty.train.Trainer.Config(...) or a subclass's Config",
        )


def _call_user_code(ref: str, function: Any) -> Any:
    """`function()`; what it raises (SystemExit included) is a RecipeError naming the file and line."""
    import traceback

    try:
        return function()
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the user's code, reported as theirs
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.endswith("config/loader.py")]
        where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
        what = (
            f"called sys.exit({error.code!r})"
            if isinstance(error, SystemExit)
            else (f"raised {type(error).__name__}: {error}")
        )
        raise RecipeError.single(f"{ref} {what}{where}", fix="fix the recipe function at that line") from None


def replace_source(loaded: LoadedRecipe, source: str) -> LoadedRecipe:
    from dataclasses import replace

    return replace(loaded, source=source)


def load_any(ref: str) -> LoadedRecipe:
    """A recipe path, a bundled recipe name, or `package.module:function`."""
    if ":" in ref and not Path(ref).exists() and not ref.endswith(".toml"):
        return load_python_recipe(ref)
    return load_recipe(ref)
