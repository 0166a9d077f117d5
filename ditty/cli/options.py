"""Taking a command's own options (`--name VALUE`, `--name=VALUE`, a bare switch) out of its arguments."""

from __future__ import annotations

from ditty.config import RecipeError


def take_option(args: list[str], names: tuple[str, ...], has_value: bool = True) -> tuple[str | None, list[str]]:
    """Remove `--name VALUE` (or `--name=VALUE`, or a bare switch) from args."""
    rest: list[str] = []
    found: str | None = None
    position = 0
    while position < len(args):
        token = args[position]
        name, equals, value = token.partition("=")
        if name in names:
            if not has_value:
                found = "true"
            elif equals:
                found = value
            elif position + 1 < len(args):
                found = args[position + 1]
                position += 1
            else:
                raise RecipeError.single(f"{name} needs a value")
        else:
            rest.append(token)
        position += 1
    return found, rest


def refuse_unknown_options(args: list[str], command: str) -> None:
    """What is left of `args` once a command took its options: a `--word` there is an option the
    command does not have, named rather than counted as a stray argument."""
    unknown = [token.partition("=")[0] for token in args if token.startswith("--")]
    if unknown:
        raise RecipeError.single(
            f"`ditty {command}` has no option {unknown[0]}", fix=f"`ditty {command} --help` lists its options"
        )
