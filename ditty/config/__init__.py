"""Recipes as data: the typed config tree, strict TOML in and out, command-line overrides."""

from ditty.config.errors import Problem, RecipeError
from ditty.config.root import TrainerConfig
from ditty.config.sections import *  # noqa: F401,F403  (the section classes are the public schema)

__all__ = ["Problem", "RecipeError", "TrainerConfig"]
