"""Know before you run: the per-rank memory and time plan of a recipe, and recipes from intent.

`make_plan(config, Target(...))` reads the model's config (a local directory, the Hugging Face
cache or ditty's table of well-known models; never weights, never the network) and returns the
bytes each rank holds (parameters, gradients, optimizer state, activations, logits, transient
buffers, fixed overhead), the knobs that would make it fit a stated device memory, and the time
per step. `render(plan)` is the text `ditty check --plan` prints; `choose_recipe` (ditty/plan/intent.py)
is `ditty init --model ... --method ...`.

Layer 3, beside ditty/recipe: reads Config classes and model configs, builds nothing heavy
(custom or unknown architectures are built on the meta device, without weights).
"""

from ditty.plan.planner import Knob, TrainingPlan, make_plan, with_changes
from ditty.plan.report import render
from ditty.plan.settings import Target, parse_memory
from ditty.plan.source import model_shape

__all__ = ["Knob", "Target", "TrainingPlan", "make_plan", "model_shape", "parse_memory", "render", "with_changes"]
