"""Model tasks: what `[model] task` means, in one table. Adding a task is one entry in `TASKS`
(plus, when no existing one fits, a file with its loss or metric).

Each entry says how ditty builds, feeds, trains, evaluates and saves a model for that task: the
transformers Auto class (and the auto mapping that lists the model types it has), the peft task type
(peft then keeps a classifier head trainable beside the adapter, as `modules_to_save`), the data
formats it reads, its loss and validation metrics as callables (like torchtitan's TrainSpec), the
`transformers.pipeline` task of the saved model, and what it allows (packing, generation). The
compiler, the model builders, the data modes, evaluation, merging, export, `ditty generate` and the
model card all read this table and nothing else.

Cheap to import (no torch, no transformers): the recipe compiler reads it. The losses import their
stages when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ditty.config.errors import RecipeError
from ditty.metrics.task_metrics import Classification, GeneratedExactMatch, Perplexity, Seq2SeqExactMatch, TaskMetric


def causal_lm_loss(train: Any = None) -> Any:
    """CausalLMLoss, or the chunked FusedLinearCrossEntropyLoss when `train.loss_chunks` > 0."""
    if train is not None and train.loss_chunks > 0:
        from ditty.stages.fused_loss import FusedLinearCrossEntropyLoss

        return FusedLinearCrossEntropyLoss(chunks=train.loss_chunks, backend=train.loss_backend)
    from ditty.stages.loss import CausalLMLoss

    return CausalLMLoss()


def bradley_terry_loss(train: Any = None) -> Any:
    """The reward model's Bradley-Terry loss over the pairs of a preference batch."""
    from ditty.objectives.reward_stage import BradleyTerryLoss

    return BradleyTerryLoss()


def pair_accuracy() -> Any:
    """val_accuracy of a reward model: held-out pairs whose chosen text scores above the rejected one."""
    from ditty.objectives.reward_stage import PairAccuracyMetric

    return PairAccuracyMetric()


def label_cross_entropy(train: Any = None) -> Any:
    """Cross-entropy against the batch's `labels` (a class per sequence or per token, or target tokens)."""
    from ditty.stages.task_losses import LabelCrossEntropyLoss

    return LabelCrossEntropyLoss()


@dataclass(frozen=True)
class ModelTask:
    name: str
    """The `[model] task` value."""
    noun: str
    """What the model is, in messages ("a causal LM", "a sequence classifier")."""
    auto_class: str
    """The transformers Auto class that builds and loads the model (`AutoModelFor...`)."""
    auto_mapping: str
    """The `*_MAPPING_NAMES` table of transformers' modeling_auto listing the model types that have it."""
    peft_task_type: Optional[str]
    """peft's `task_type` ("SEQ_CLS", ...): the adapter's class, which head stays trainable, how it loads."""
    data_formats: tuple[str, ...]
    """`data.format` values this task reads; the first is its own."""
    loss: Callable[[Any], Any]
    """Builds the default loss (a LossCalculator) from `[train]`, when `[[pipeline.loss]]` names none."""
    metrics: tuple[Callable[[], TaskMetric], ...]
    """What evaluation logs beside val_loss (val_* keys in metrics.jsonl; ditty.metrics.task_metrics)."""
    pipeline_tag: str
    """The Hub's pipeline_tag of the saved model (its model card)."""
    pipeline: Optional[str]
    """The `transformers.pipeline` task that runs the saved model (None: transformers 5 has none for it;
    it removed text2text-generation, so a seq2seq model runs with `generate`)."""
    labels: bool = False
    """The training data defines a label set: num_labels, id2label and label2id of the model config."""
    num_labels: Optional[int] = None
    """A head of fixed size whatever the data (a reward model's one score); None: the data's label set
    sizes it (`labels`), or the task has no label head."""
    head: bool = False
    """The task puts a new head on a pretrained body (a classifier): newly initialised weights there are
    expected, and under an adapter the head trains fully (peft's modules_to_save)."""
    packing: bool = False
    """Several samples may share a row (causal attention with a block-diagonal mask)."""
    generates: bool = False
    """The model writes text: `ditty generate` and generation-based metrics (exact match) apply."""
    token_rows: bool = False
    """Batches are the causal-LM token rows of ditty.data (a token format's collator); otherwise a task collator."""

    @property
    def peft_auto_class(self) -> Optional[str]:
        """peft's Auto class that loads a saved adapter of this task (`AutoPeftModelFor...`), when peft
        has one (not for masked LM: there the task's transformers Auto class loads base and adapter)."""
        name = "AutoPeftModel" + self.auto_class.removeprefix("AutoModel")
        return name if self.peft_task_type else None


TASKS: dict[str, ModelTask] = {
    task.name: task
    for task in (
        ModelTask(
            name="causal-lm",
            noun="a causal LM",
            auto_class="AutoModelForCausalLM",
            auto_mapping="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            peft_task_type="CAUSAL_LM",
            data_formats=("prompt_completion", "text", "chat", "preference", "unpaired_preference", "prompt"),
            loss=causal_lm_loss,
            metrics=(Perplexity, GeneratedExactMatch),
            pipeline_tag="text-generation",
            pipeline="text-generation",
            packing=True,
            generates=True,
            token_rows=True,
        ),
        ModelTask(
            name="seq-classification",
            noun="a sequence classifier",
            auto_class="AutoModelForSequenceClassification",
            auto_mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            peft_task_type="SEQ_CLS",
            data_formats=("classification",),
            loss=label_cross_entropy,
            metrics=(Classification,),
            pipeline_tag="text-classification",
            pipeline="text-classification",
            labels=True,
            head=True,
        ),
        ModelTask(
            name="token-classification",
            noun="a token classifier",
            auto_class="AutoModelForTokenClassification",
            auto_mapping="MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
            peft_task_type="TOKEN_CLS",
            data_formats=("token_classification",),
            loss=label_cross_entropy,
            metrics=(Classification,),
            pipeline_tag="token-classification",
            pipeline="token-classification",
            labels=True,
            head=True,
        ),
        ModelTask(
            name="seq2seq",
            noun="an encoder-decoder (seq2seq) model",
            auto_class="AutoModelForSeq2SeqLM",
            auto_mapping="MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
            peft_task_type="SEQ_2_SEQ_LM",
            data_formats=("seq2seq",),
            loss=label_cross_entropy,
            metrics=(Seq2SeqExactMatch,),
            pipeline_tag="text2text-generation",
            pipeline=None,
            generates=True,
        ),
        ModelTask(
            name="masked-lm",
            noun="a masked LM",
            auto_class="AutoModelForMaskedLM",
            auto_mapping="MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            peft_task_type=None,  # peft has no masked-LM task type: a plain PeftModel
            data_formats=("masked_lm",),
            loss=label_cross_entropy,
            metrics=(Perplexity,),
            pipeline_tag="fill-mask",
            pipeline="fill-mask",
        ),
        ModelTask(
            # A Bradley-Terry scorer: the sequence classifier with one output scores the chosen and the
            # rejected text of each preference pair (ditty.objectives.reward_stage). Last in the table: a saved
            # model of the same class is a classifier unless its one label says otherwise (task_support).
            name="reward-model",
            noun="a reward model (a sequence classifier with one score)",
            auto_class="AutoModelForSequenceClassification",
            auto_mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            peft_task_type="SEQ_CLS",
            data_formats=("preference",),
            loss=bradley_terry_loss,
            metrics=(pair_accuracy,),  # of pairs: the chosen text scored above the rejected one
            pipeline_tag="text-classification",
            pipeline="text-classification",
            num_labels=1,
            head=True,
        ),
    )
}

DEFAULT_TASK = "causal-lm"


def model_task(name: str) -> ModelTask:
    """The table entry of `[model] task` (the compiler has checked the name; the Literal type too)."""
    try:
        return TASKS[name]
    except KeyError:
        raise RecipeError.single(
            f"unknown model task {name!r}", key="model.task", fix=f"use one of {', '.join(TASKS)}"
        ) from None


def task_of_format(data_format: str) -> Optional[ModelTask]:
    """The task whose own format `data_format` is (None for a format of several tasks or none)."""
    owners = [task for task in TASKS.values() if task.data_formats[0] == data_format]
    return owners[0] if len(owners) == 1 else None


def transformers_class(task: ModelTask):
    """The transformers Auto class object (imports transformers)."""
    import transformers

    return getattr(transformers, task.auto_class)
