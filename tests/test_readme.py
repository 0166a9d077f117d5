"""The code blocks of the README and of the documentation site, run as a new user runs them (in the
manner of litgpt's test_readme).

Every fenced block of README.md and of the pages under docs/ is one test, named by its file and line
(the dated result files under docs/benchmarks/ are records of what was run, with commands that take
minutes to hours: not run). A block whose text, language and markers repeat an earlier one (the
README shows the pages' examples) runs once, under its first place. Blocks run in one working
directory that looks like a fresh clone (`recipes/` and the `Makefile` beside it) plus the files the
examples name (`my.toml`, `my.jsonl`, `data/reviews.jsonl`, `models/my-bert`, ...):

- shell blocks (`bash`, `sh`, `console`): each `ditty ...` line (also `.venv/bin/ditty`, `python -m
  ditty`) runs in-process through `ditty.cli.main` and must exit 0; `make TARGET` runs the ditty
  command of that Makefile target. `ditty run` gets a few flags more (SHORT_RUN) so it trains for a
  few steps: the user's recipe and flags otherwise, as written.
- `toml` blocks are recipes or parts of one: `ditty check` of the block must exit 0.
- `python` blocks are executed as written.
- `jsonl` blocks are example rows: each line must be a JSON object.
- `text` and `yaml` blocks are not run.

A page's quick start is run as a reader runs it, on the reader's "own" data: its `jsonl` rows are
written to the file the next recipe on the page names (`data.path`, `data.val_path`; repeated to
MIN_ROWS rows), a `toml` or `python` block whose first line is a comment naming a file (`# my_sft.toml`,
`# my_rewards.py`) is saved under that name, and `path/to/your/model` (`path/to/your/teacher`) is a
tiny Llama saved with save_pretrained, its byte tokenizer carrying a chat template, as a user's local
model directory would. Every block of a page finds the files of the blocks above it on the page.

A marker comment on the lines just above a block changes that (it does not show on GitHub):
`<!-- readme-test: skip REASON -->` (never run: a GPU, several machines, the Hub), `<!-- readme-test:
flags --section.field VALUE ... -->` (flags added to its `ditty` commands, for a fragment of a
recipe), `<!-- readme-test: slow -->` (the block is marked slow; blocks that train, or read a trained run,
are marked slow without it). A block in any other language
fails until it is given one of those.

Two results are shared, each made once, when a block first needs it: the demo run (`make demo`,
shortened) in `runs/tiny_sft`, and the docs' classifier recipe trained into
`runs/my-classifier`. A second-stage recipe's start (`tiny_grpo` reads `runs/tiny_sft_start/final`)
is made by the command its header names when no block made it before, so no block depends on
another page's block having run first.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tasks.test_classifier_final import ROWS as TOPIC_ROWS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
NOT_RUN_DOCS = DOCS / "benchmarks"  # dated records of runs; their commands take minutes to hours


def doc_files() -> list[Path]:
    """README.md, then every page of the site (less the benchmark records), in a stable order."""
    pages = sorted(p for p in DOCS.rglob("*.md") if NOT_RUN_DOCS not in p.parents)
    return [README, *pages]


# `ditty run` of a block trains this long (the flags come after the user's, so they win).
SHORT_RUN = ("--train.steps", "3", "--train.eval_every", "3", "--train.eval_samples", "8")
SHORT_RUN += ("--train.log_every", "1", "--scheduler.warmup_steps", "1", "--logging.progress", "false")
SHORT_BUILTIN = ("--data.num_samples", "400")  # built-in data sets: fewer generated rows

# Makefile targets a block names that the test does not run, and why.
MAKE_TARGETS_NOT_RUN = {
    "test": "the whole test suite, which holds this test",
    "test-quick": "the test suite without slow tests, which holds this test",
    "lint": "ruff over the repository, which CI runs on its own",
    "docs": "the site's build, which tests/docs/test_docs_site.py runs",
}
SHELL = {"bash", "sh", "shell", "console"}
NOT_CODE = {"text", "yaml"}  # listings, and files of other tools (an lm-eval task) that ditty reads
ROWS = {"jsonl"}  # example rows of a data file
MIN_ROWS = 64  # a quick start's example rows are repeated to this many (a held-out share and a few batches)
# The first line of a toml or python block that is a file of the reader's: `# my_sft.toml`, `# my_rewards.py`.
FILE_HEADER = re.compile(r"^#\s*([\w./-]+\.(?:toml|py))\s*$")
MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|flags|slow)\b\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    line: int  # line of the opening fence, from 1
    lang: str
    text: str
    skip: str | None = None  # why it never runs
    flags: tuple[str, ...] = ()
    slow: bool = False
    source: str = "README.md"  # the file, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.source}:L{self.line}-{self.lang or 'plain'}"

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
    """The fenced blocks of a Markdown text, with the readme-test markers of the lines above each."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[index])
        if not opening:
            index += 1
            continue
        fence = opening.group(2)
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        markers: dict[str, str] = {}
        above = index - 1
        while above >= 0 and (not lines[above].strip() or MARKER.search(lines[above])):
            for found in MARKER.finditer(lines[above]):
                markers[found.group(1)] = found.group(2)
            above -= 1
        body = "\n".join(line[len(opening.group(1)) :] for line in lines[index + 1 : end])
        blocks.append(
            Block(
                line=index + 1,
                lang=opening.group(3).lower(),
                text=body,
                skip=markers.get("skip") or None,
                flags=tuple(shlex.split(markers.get("flags", ""))),
                slow="slow" in markers,
                source=source,
            )
        )
        index = end + 1
    return blocks


def doc_blocks() -> list[Block]:
    """The blocks of README.md and the docs pages; a repeat of an earlier block (same language,
    text and markers) is left out, so each example runs once."""
    blocks, seen = [], set()
    for path in doc_files():
        for block in readme_blocks(path.read_text(), str(path.relative_to(ROOT))):
            key = (block.lang, block.text, block.skip, block.flags, block.slow)
            if key not in seen:
                seen.add(key)
                blocks.append(block)
    return blocks


def named_file(block: Block) -> str | None:
    """The file a toml or python block is, by its first line (`# my_sft.toml`), or None."""
    if block.lang not in ("toml", "python") or not block.text.strip():
        return None
    found = FILE_HEADER.match(block.text.lstrip().splitlines()[0])
    return found.group(1) if found else None


def data_files(recipe: str) -> list[str]:
    """The .jsonl files a recipe's [data] names (path, val_path, each source's), in that order."""
    import tomllib

    data = tomllib.loads(recipe).get("data", {})
    named = [data.get("path"), data.get("val_path"), *(s.get("path") for s in data.get("sources", []))]
    return [path for path in named if isinstance(path, str) and path.endswith(".jsonl")]


def example_rows(block: Block) -> list[dict]:
    rows = [json.loads(line) for line in block.text.splitlines() if line.strip()]
    assert rows and all(isinstance(row, dict) for row in rows), f"{block.where}: each line is one JSON object"
    return rows


def write_page_files(block: Block, workdir: Path) -> None:
    """The files the blocks of `block`'s page above it (and itself) make: example rows written to the
    data files of the next recipe on the page, and the blocks that are files saved under their names."""
    page = ROOT / block.source
    blocks = readme_blocks(page.read_text(), block.source)
    for index, earlier in enumerate(blocks):
        if earlier.line > block.line:
            break
        if earlier.lang in ROWS:
            rows = example_rows(earlier)
            recipe = next((b for b in blocks[index + 1 :] if b.lang == "toml"), None)
            assert recipe is not None, f"{earlier.where}: example rows need a recipe after them that names their file"
            targets = data_files(recipe.text)
            assert targets, f"{earlier.where}: the recipe at {recipe.where} names no .jsonl data.path"
            for target in targets:
                write_jsonl(workdir / target, [rows[i % len(rows)] for i in range(max(MIN_ROWS, len(rows)))])
        elif name := named_file(earlier):
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            (workdir / name).write_text(earlier.text + "\n")


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def ditty_args(words: list[str]) -> list[str] | None:
    """The arguments of a ditty command line, or None when the line runs something else."""
    if words and Path(words[0]).name == "ditty":
        return words[1:]
    if words[:3] in (["python", "-m", "ditty"], ["python3", "-m", "ditty"]):
        return words[3:]
    return None


def make_target_command(target: str) -> list[str]:
    """The ditty arguments a Makefile target runs (`$(VENV)/bin/ditty run tiny_sft` -> run tiny_sft)."""
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)+)", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe, f"the Makefile has no target {target!r}"
    for line in recipe.group(1).splitlines():
        args = ditty_args(shlex.split(line.strip()))
        if args is not None:
            return args
    raise AssertionError(f"make {target} runs no ditty command; teach tests/test_readme.py what it does")


def shortened(args: list[str]) -> list[str]:
    """A `ditty run` trains a few steps (built-in data: fewer generated rows); other commands as written."""
    if not args or args[0] != "run":
        return args
    from ditty.config.loader import load_recipe

    extra = list(SHORT_RUN)
    if load_recipe(args[1]).config.data.source == "builtin":
        extra += SHORT_BUILTIN
    return [*args, *extra]


def run_ditty(args: list[str], capsys, where: str) -> str:
    """`ditty ARGS` in-process; it must exit 0. Returns what it printed."""
    import torch

    from ditty.cli import main

    threads = torch.get_num_threads()
    try:
        code = main(list(args))
    finally:
        torch.set_num_threads(threads)  # a run picks its own thread count; the next test keeps ours
    out, err = capsys.readouterr()
    assert code == 0, f"{where}: `ditty {shlex.join(args)}` exited {code}\n{out[-3000:]}\n{err[-3000:]}"
    return out


# ---------------------------------------------------------------- the working directory


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def save_bert_base_shape(path: Path) -> None:
    """A BERT with bert-base's 512 positions and vocabulary layout, 2 layers and 32 wide (a stand-in
    for a user's local bert-base: the docs' classifier recipe keeps data.max_seq_len's default)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from tests.tasks.models import ENCODER_SIZES, wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **ENCODER_SIZES)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def save_own_model(path: Path, **sizes) -> None:
    """A tiny Llama in Hugging Face format whose tokenizer has a chat template and a chat model's
    context (4096 positions: the docs' rollouts, prompt and completion, are sized for one)."""
    from transformers import AutoTokenizer

    from ditty.data.chat_templates import CHATML
    from tests.conftest import _save_tiny

    _save_tiny(path, "llama", **{"max_position_embeddings": 4096, **sizes})
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A fresh clone's directory, with the files the examples name."""
    root = tmp_path_factory.mktemp("readme")
    (root / "recipes").symlink_to(ROOT / "recipes")
    (root / "Makefile").symlink_to(ROOT / "Makefile")
    save_bert_base_shape(root / "models" / "my-bert")
    write_jsonl(root / "data" / "reviews.jsonl", [{"text": t, "label": y} for t, y in TOPIC_ROWS * 4])
    prose = [{"text": f"line {i} of some text to train on"} for i in range(16)]
    write_jsonl(root / "web" / "part-0.jsonl", prose)
    pairs = [{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(16)]
    write_jsonl(root / "code-val.jsonl", pairs)
    write_jsonl(root / "held-out.jsonl", prose)
    turns = [[{"role": "user", "content": f"{i}+1?"}, {"role": "assistant", "content": str(i + 1)}] for i in range(8)]
    write_jsonl(root / "my.jsonl", [{"messages": messages} for messages in turns])
    save_own_model(root / "path/to/your/model")  # the reader's local model directories of the quick starts
    save_own_model(root / "path/to/your/teacher", num_hidden_layers=3)  # a teacher other than its student
    # `my.toml` stands for the user's own recipe for a large model on many GPUs (planned, never run)
    from ditty.cli import main

    args = ["init", "--model", "meta-llama/Meta-Llama-3-8B", "--method", "full", "--gpus", "8"]
    assert main([*args, "--gpu-memory", "80GB", "--global-batch", "256", "-o", str(root / "my.toml")]) == 0
    return root


@pytest.fixture(scope="module")
def results(workdir) -> dict[str, Path]:
    """Runs the blocks share, made once by the first block that needs them."""
    return {}


def demo_run(workdir: Path, results: dict, capsys) -> Path:
    """`make demo` (shortened): what runs/tiny_sft holds for every block after it."""
    if "demo" not in results:
        out = run_ditty(shortened(make_target_command("demo")), capsys, "make demo")
        # What the README says the run prints: the final held-out exact match and where the model went.
        assert re.search(r"val_exact_match \d", out) and "model saved to runs/tiny_sft/final" in out, out[-2000:]
        results["demo"] = workdir / "runs" / "tiny_sft"
    return results["demo"]


def classifier_run(workdir: Path, results: dict, capsys) -> Path:
    """The docs' classifier recipe (the toml block with task "seq-classification"), trained."""
    if "classifier" not in results:
        recipe = next(b for b in doc_blocks() if 'task = "seq-classification"' in b.text)
        path = workdir / f"{recipe.id}.toml".replace("/", "_").replace(":", "_")
        path.write_text(recipe.text + "\n")
        args = ["run", str(path), "--run.output_dir", "runs/my-classifier"]
        run_ditty(shortened(args), capsys, recipe.where)
        results["classifier"] = workdir / "runs" / "my-classifier"
    return results["classifier"]


# What a block may read that another block (or `make demo`) makes.
SHARED_RUNS = {"runs/tiny_sft": demo_run, "runs/my-classifier": classifier_run}


def first_stage(args: list[str], results: dict, capsys, where: str) -> None:
    """A second stage's start, made once when no block made it yet: `ditty run tiny_grpo` reads
    runs/tiny_sft_start/final, which the README's block makes, but a page's block (RLOO's) must not
    depend on another page's block having run first in the same directory. The command is the one
    the recipe's header names (what `ditty check` tells a user to run), shortened like any other."""
    if args[:1] != ["run"] or any(word.startswith("--model.path") for word in args):
        return
    from ditty.config.loader import load_recipe
    from ditty.recipe.first_stage import first_stage_command

    loaded = load_recipe(args[1])
    start = loaded.config.model.path or loaded.config.distill.teacher  # tiny_distill's start is its teacher
    if not start or Path(start).is_dir() or f"first stage {start}" in results:
        return
    shared = SHARED_RUNS.get(str(Path(start).parent))
    if shared is not None and Path(start).name == "final":  # the demo run (tiny_reward's and tiny_distill's start)
        shared(Path.cwd(), results, capsys)
        return
    command = first_stage_command(Path(loaded.source).read_text(), start)
    if command is not None:
        run_ditty(shortened(shlex.split(command)[1:]), capsys, f"{where} (its first stage)")
        results[f"first stage {start}"] = Path(start)


# ---------------------------------------------------------------- the tests


def test_the_readme_has_blocks_of_each_kind():
    blocks = readme_blocks(README.read_text())
    langs = {block.lang for block in blocks}
    assert {"bash", "toml", "python"} <= langs, langs
    every = [block for path in doc_files() for block in readme_blocks(path.read_text(), str(path.relative_to(ROOT)))]
    unknown = [b.id for b in every if not b.skip and b.lang not in SHELL | NOT_CODE | ROWS | {"toml", "python"}]
    assert not unknown, f"blocks without a language the test runs; tag them or add a skip marker: {unknown}"


def test_the_docs_pages_are_read_and_repeats_run_once():
    """The pages' blocks are collected beside the README's (the moved examples still run), and a block
    the README repeats from a page is one test, not two."""
    sources = {block.source for block in doc_blocks()}
    assert "README.md" in sources and "docs/objectives/rl.md" in sources, sorted(sources)
    assert not any(source.startswith("docs/benchmarks/") for source in sources)
    text = "```bash\nditty ls\n```\n"
    first, again = readme_blocks(text, "a.md") + readme_blocks(text, "b.md")
    assert (first.id, again.id) == ("a.md:L1-bash", "b.md:L1-bash") and first.text == again.text


def test_markers_are_read():
    text = "a\n<!-- readme-test: skip needs two machines -->\n\n```bash\nditty ls\n```\n"
    text += "<!-- readme-test: flags --train.steps 5 -->\n<!-- readme-test: slow -->\n```toml\n[run]\n```\n"
    first, second = readme_blocks(text)
    assert (first.line, first.lang, first.text, first.skip) == (4, "bash", "ditty ls", "needs two machines")
    assert (second.skip, second.flags, second.slow) == (None, ("--train.steps", "5"), True)
    assert shell_commands("ditty run r.toml --a 1 \\\n  --b 2   # comment\n\n# only a comment\nmake demo") == [
        ["ditty", "run", "r.toml", "--a", "1", "--b", "2"],
        ["make", "demo"],
    ]


QUICK_STARTS = (
    "docs/objectives/sft.md",
    "docs/models.md",
    "docs/objectives/preference.md",
    "docs/objectives/reward-models.md",
    "docs/objectives/rl.md",
    "docs/objectives/tools.md",
    "docs/objectives/environments.md",
    "docs/objectives/distillation.md",
    "docs/objectives/online-preference.md",
    "docs/objectives/vllm.md",
)


@pytest.mark.parametrize("source", QUICK_STARTS)
def test_every_objective_page_opens_with_a_quick_start_the_test_runs(source):
    """Example rows (jsonl) whose file the next recipe names, the whole recipe as a file of its own
    (`# my_x.toml`, with a [model] and a [data] table) and a shell block that runs it: the three
    blocks this module runs as a reader would, on the page's first section."""
    text = (ROOT / source).read_text()
    first = text[: text.index("\n## ", text.index("## Quick start")) if "## Quick start" in text else 0]
    assert "## Quick start" in text, f"{source} has no quick start section"
    blocks = readme_blocks(text, source)
    rows = next(b for b in blocks if b.lang in ROWS)
    recipe = next(b for b in blocks if b.lang == "toml" and b.line > rows.line)
    name = named_file(recipe)
    assert name and f"```toml\n{recipe.text}" in first, f"{recipe.where}: the quick start's recipe names its file"
    assert "[model]" in recipe.text and "[data]" in recipe.text and data_files(recipe.text), recipe.where
    runs = [b for b in blocks if b.lang in SHELL and b.line > recipe.line and f"ditty run {name}" in b.text]
    assert runs, f"{source}: no shell block runs `ditty run {name}`"
    assert any(not b.skip for b in runs) or "test_vllm" in runs[0].skip, f"{runs[0].where} is never run"


def trains(block: Block) -> bool:
    """Whether a block trains a model (or needs a trained one): those tests are marked slow."""
    names_a_run = any(path in block.text for path in SHARED_RUNS)
    return names_a_run or bool(re.search(r"make demo|ditty run |--probe", block.text))


def _params():
    params = []
    for block in doc_blocks():
        marks = []
        if block.skip:
            marks.append(pytest.mark.skip(reason=f"{block.where}: {block.skip}"))
        elif block.lang in NOT_CODE:
            marks.append(pytest.mark.skip(reason=f"{block.where}: a {block.lang} block, not run"))
        if block.slow or trains(block):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.mark.xdist_group("readme")  # the blocks share one working directory and its runs
@pytest.mark.parametrize("block", _params())
def test_readme_block(block: Block, workdir, results, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    where = block.where
    write_page_files(block, workdir)
    for path, make in SHARED_RUNS.items():
        if path in block.text and not (block.lang in SHELL and "make demo" in block.text):
            assert (make(workdir, results, capsys) / "final").is_dir()

    if block.lang == "toml":
        path = workdir / f"{block.id}.toml".replace("/", "_").replace(":", "_")
        path.write_text(block.text + "\n")
        out = run_ditty(["check", path.name, *block.flags], capsys, where)
        assert "ok: the recipe is valid" in out
    elif block.lang in ROWS:
        assert example_rows(block)  # and written, above, to the file the page's recipe names
    elif block.lang == "python":
        exec(compile(block.text, where, "exec"), {"__name__": "__readme__"})
    elif block.lang in SHELL:
        ran = 0
        for words in shell_commands(block.text):
            if words[0] == "make":
                target = words[1]
                if target in MAKE_TARGETS_NOT_RUN:
                    continue
                assert target == "demo", f"{where}: `make {target}`: say in MAKE_TARGETS_NOT_RUN why it is not run"
                demo = demo_run(workdir, results, capsys)
                assert (demo / "final" / "config.json").is_file() and (demo / "metrics.jsonl").is_file()
                ran += 1
                continue
            args = ditty_args(words)
            assert args is not None, f"{where}: `{shlex.join(words)}` is not a ditty command: add a skip marker"
            if args == ["run", "tiny_sft"] and not block.flags:  # `make demo` is this command: one run for all
                demo_run(workdir, results, capsys)
                ran += 1
                continue
            first_stage([*args, *block.flags], results, capsys, where)
            run_ditty(shortened([*args, *block.flags]), capsys, where)
            ran += 1
        assert ran, f"{where}: nothing in this block ran"
    else:
        pytest.fail(f"{where}: a {block.lang!r} block; add a skip marker or teach the test to run it")
