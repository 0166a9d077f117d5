"""Accuracy and macro-F1 of predicted class ids, summed over batches and ranks.

`ClassificationCounts.add(predictions, labels)` keeps, per class, true positives, false positives and
false negatives (-100 labels are skipped); `result()` sums them over ranks (one all-reduce) and gives
{"accuracy", "f1"}: F1 averaged over the classes that occur among the labels or the predictions,
which is scikit-learn's `f1_score(average="macro")` (a class with neither contributes nothing; one
predicted but absent contributes 0).
"""

from __future__ import annotations

import torch

from ditty._utils.labels import IGNORE_INDEX


class ClassificationCounts:
    def __init__(self, num_classes: int) -> None:
        # [true positives, false positives, false negatives] per class; float64 for exact sums.
        self.counts = torch.zeros(3, num_classes, dtype=torch.float64)

    def add(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        scored = labels != IGNORE_INDEX
        predicted, actual = predictions[scored].long().cpu(), labels[scored].long().cpu()
        size = self.counts.shape[1]
        hit = predicted == actual
        self.counts[0] += torch.bincount(actual[hit], minlength=size)[:size].double()
        self.counts[1] += torch.bincount(predicted[~hit], minlength=size)[:size].double()
        self.counts[2] += torch.bincount(actual[~hit], minlength=size)[:size].double()

    def result(self) -> dict[str, float]:
        import torch.distributed as dist

        counts = self.counts.clone()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            counts = counts.to(device)
            dist.all_reduce(counts)
            counts = counts.cpu()
        true_pos, false_pos, false_neg = counts
        total = float((true_pos + false_neg).sum())
        present = (true_pos + false_pos + false_neg) > 0
        f1 = 2 * true_pos / (2 * true_pos + false_pos + false_neg).clamp_min(1)
        return {
            "accuracy": float(true_pos.sum()) / total if total else 0.0,
            "f1": float(f1[present].mean()) if bool(present.any()) else 0.0,
        }
