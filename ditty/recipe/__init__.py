"""The recipe compiler: every check on a recipe, before anything heavy is built.

`compile_recipe(loaded, world_size)` runs each rule of `ditty.recipe.rules` and returns a `Plan`:
the derived numbers (accumulation, tokens per step, steps), what will be built, and every problem
found. It reads config classes and declared capabilities only; it never loads weights or data.
"""

from ditty.recipe.compiled import Plan
from ditty.recipe.compiler import compile_config, compile_recipe

__all__ = ["compile_config", "compile_recipe", "Plan"]
