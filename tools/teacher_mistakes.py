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

from transformers import AutoModelForCausalLM, AutoTokenizer

from ditty.data.builtin import generate_problems, split_problems
from ditty.data.task import greedy_generate

NUM_SAMPLES, VAL_FRACTION = 20000, 0.05  # tiny_distill's [data]
MAX_NEW_TOKENS = 4  # the longest sum (198) and its end of sequence: what ditty's evaluation generates


def greedy_answers(model_dir: str, prompts: list[str], batch_size: int = 64) -> list[str]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        answers += greedy_generate(model, tokenizer, prompts[start : start + batch_size], "cpu", MAX_NEW_TOKENS)
    return [a.strip() for a in answers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher")
    parser.add_argument("--students", nargs="+", default=[])
    parser.add_argument("--baselines", nargs="+", default=[])
    args = parser.parse_args()

    _, held_out = split_problems(generate_problems("addition", NUM_SAMPLES), VAL_FRACTION)
    prompts, truth = [p for p, _ in held_out], [a for _, a in held_out]
    teacher = greedy_answers(args.teacher, prompts)
    teacher_wrong = {i for i, (a, t) in enumerate(zip(teacher, truth)) if a != t}
    print(f"{len(prompts)} held-out problems; the teacher gets {len(teacher_wrong)} wrong")
    print("| model | kind | exact match | mistakes | on the teacher's mistakes | the teacher's wrong answer | on the rest |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, dirs in (("student", args.students), ("baseline", args.baselines)):
        totals = [0, 0, 0, 0]
        for model_dir in dirs:
            answers = greedy_answers(model_dir, prompts)
            wrong = {i for i, (a, t) in enumerate(zip(answers, truth)) if a != t}
            shared = wrong & teacher_wrong
            copied = sum(answers[i] == teacher[i] for i in shared)
            row = [len(wrong), len(shared), copied, len(wrong - teacher_wrong)]
            totals = [x + y for x, y in zip(totals, row)]
            match = 1 - len(wrong) / len(prompts)
            print(f"| {model_dir} | {kind} | {match:.3f} | " + " | ".join(map(str, row)) + " |")
        if dirs:
            print(f"| all {kind}s | {kind} | | " + " | ".join(map(str, totals)) + " |")


if __name__ == "__main__":
    main()
