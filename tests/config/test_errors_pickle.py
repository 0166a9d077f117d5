"""A RecipeError survives pickling (ranks send each other the error to raise: broadcast_object_list)."""

import pickle

from ditty.config.errors import Problem, RecipeError


def test_recipe_error_round_trips_through_pickle():
    error = RecipeError(
        [Problem("model.path", "no weights", fix="point at a checkpoint"), Problem("train.steps", "must be positive")],
        source="r.toml",
    )
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RecipeError and copy.problems == error.problems and copy.source == "r.toml"
    assert str(copy) == str(error)
