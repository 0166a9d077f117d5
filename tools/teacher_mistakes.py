"""How many of a distilled student's held-out mistakes are its teacher's, beside a baseline's.

    python tools/teacher_mistakes.py TEACHER_DIR --students DIR... --baselines DIR...

scores the teacher and every model on all held-out problems of the built-in addition task (as
`tiny_distill` splits it) by greedy exact match, the way ditty's evaluation scores them, and prints
one row per model: its mistakes, how many fall on problems the teacher gets wrong, how many repeat the
teacher's own wrong answer, and its mistakes on the problems the teacher gets right. Students are the
distilled models; baselines the same student trained on the data (`--distill.kind none`), which
never saw the teacher: their overlap with it is what chance and the task's hard problems give.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from ditty.data.builtin import generate_problems, split_problems
from ditty.data.task import greedy_generate

NUM_SAMPLES, VAL_FRACTION = 20000, 0.05  # tiny_distill's [data]
MAX_NEW_TOKENS = 4  # the longest sum (198) and its end of sequence: what ditty's evaluation generates


def held_out_problems() -> list[tuple[str, str]]:
    """(prompt, answer) of every distinct held-out problem, in the order ditty's evaluation reads them."""
    return split_problems(generate_problems("addition", NUM_SAMPLES), VAL_FRACTION)[1]


def greedy_answers(model_dir: str, prompts: list[str], batch_size: int = 64) -> list[str]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        answers += greedy_generate(model, tokenizer, prompts[start : start + batch_size], "cpu", MAX_NEW_TOKENS)
    return [a.strip() for a in answers]


def mistake_counts(answers: list[str], teacher: list[str], truth: list[str]) -> dict[str, int]:
    """One model's mistakes, those on problems the teacher gets wrong, those that repeat the
    teacher's wrong answer, and those on the problems the teacher gets right."""
    wrong = {i for i, (a, t) in enumerate(zip(answers, truth)) if a != t}
    teacher_wrong = {i for i, (a, t) in enumerate(zip(teacher, truth)) if a != t}
    shared = wrong & teacher_wrong
    return {
        "mistakes": len(wrong),
        "on_teacher_mistakes": len(shared),
        "teacher_answer": sum(answers[i] == teacher[i] for i in shared),
        "on_the_rest": len(wrong - teacher_wrong),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher")
    parser.add_argument("--students", nargs="+", default=[])
    parser.add_argument("--baselines", nargs="+", default=[])
    args = parser.parse_args()
    for model_dir in [args.teacher, *args.students, *args.baselines]:
        if not (Path(model_dir) / "config.json").is_file():
            parser.error(f"{model_dir} is not a saved model (no config.json): pass a run's final/ directory")

    held_out = held_out_problems()
    prompts, truth = [p for p, _ in held_out], [a for _, a in held_out]
    teacher = greedy_answers(args.teacher, prompts)
    print(f"{len(prompts)} held-out problems; the teacher gets {sum(a != t for a, t in zip(teacher, truth))} wrong")
    columns = ("model", "kind", "exact match", "mistakes", "on the teacher's mistakes", "the teacher's answer")
    columns += ("on the rest",)
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, dirs in (("student", args.students), ("baseline", args.baselines)):
        totals: Counter[str] = Counter()
        for model_dir in dirs:
            counts = mistake_counts(greedy_answers(model_dir, prompts), teacher, truth)
            totals.update(counts)
            match = 1 - counts["mistakes"] / len(prompts)
            print(f"| {model_dir} | {kind} | {match:.3f} | " + " | ".join(map(str, counts.values())) + " |")
        if dirs:
            print(f"| all {kind}s | {kind} | | " + " | ".join(str(totals[k]) for k in counts) + " |")


if __name__ == "__main__":
    main()
