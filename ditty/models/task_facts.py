"""What a model of a task already says about its data: a pretrained classifier's label names, a
seq2seq model's decoder start token; and fitting a given classifier to the data's label set."""

from __future__ import annotations

from typing import Any, Optional

from ditty.config.errors import RecipeError


def model_facts(model: Any, given: Any, tokenizer: Any) -> tuple[Optional[list[str]], Optional[int]]:
    """What the model already says, so the data fits it: (the label names of its config in id order,
    its decoder start token id). Read from the given instance, else from [model]'s config (`model`)."""
    from ditty.models.tasks import model_task

    if model_task(model.task).token_rows:
        return None, None
    model_config = getattr(given, "config", None) if given is not None else None
    if given is None and not model.factory:
        from ditty.models.build import hf_config

        _, model_config = hf_config(model, {})
    if model_config is None:
        return None, None
    id2label = getattr(model_config, "id2label", None) or {}
    names = [str(id2label[key]) for key in sorted(id2label, key=int)] or None
    start = getattr(model_config, "decoder_start_token_id", None)
    if start is None and getattr(model_config, "is_encoder_decoder", False):
        start = tokenizer.pad_token_id  # what ditty.models.build gives a config without one (T5's rule)
    return names, start


def fit_instance_labels(model: Any, labels: Any) -> None:
    """A given classifier must have a head of the data's label count; its label names become the data's."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_labels"):
        return
    if config.num_labels != len(labels):
        raise RecipeError.single(
            f"the given model classifies into {config.num_labels} labels and the data has {len(labels)} "
            f"({', '.join(labels.names[:8])})",
            key="model_factory",
            fix=f"build the model with num_labels={len(labels)} (and id2label/label2id), or fix the data's labels",
        )
    # The label ids already follow the model's own names when they cover the data (LabelSpace's hint);
    # otherwise (transformers' LABEL_i defaults, say) the model takes the data's names.
    current = [str(config.id2label[i]) for i in sorted(config.id2label)]
    if current != list(labels.names):
        config.id2label = dict(enumerate(labels.names))
        config.label2id = {name: index for index, name in enumerate(labels.names)}
