"""Pushing a finished model (or adapter) to the Hugging Face Hub, and the model card that goes with it.

The token: huggingface_hub finds it (`HF_TOKEN`, then the login cache of `hf auth login`); ditty only
passes it through in memory. It is never written to the run directory, a log line, the card, or an
error message (messages are scrubbed of it). huggingface_hub is imported inside the functions: it
reads `HF_ENDPOINT` and friends when first imported, and most runs never push.

A failed push changes nothing locally: the run directory is only read (the card travels in the
commit, and `ditty push` writes it into final/ only once the push succeeded). Every Hub call says
what it waits for and gives up after $DITTY_HUB_TIMEOUT_S (default 60) seconds without an answer.
The error says so and names `ditty push RUN_DIR` to retry, which re-uploads the whole folder in one
new commit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

from ditty.config.errors import RecipeError

log = logging.getLogger(__name__)

# Shape of Hugging Face user access tokens; scrubbed from the card as a second line of defence.
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")


def _scrub(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "***")
    return _TOKEN_RE.sub("hf_***", text)


def _current_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


HUB_TIMEOUT_ENV = "DITTY_HUB_TIMEOUT_S"
DEFAULT_HUB_TIMEOUT_S = 60.0
"""How long a Hub call waits to connect, or for the next bytes of an answer, before it gives up
(huggingface_hub's own client waits forever)."""


def hub_timeout() -> float:
    return float(os.environ.get(HUB_TIMEOUT_ENV) or DEFAULT_HUB_TIMEOUT_S)


@contextlib.contextmanager
def _timeouts(seconds: float) -> Iterator[None]:
    """huggingface_hub's shared HTTP client, with `seconds` as its timeout for the block's length."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", _http.default_client_factory)

    def with_timeout():
        client = previous()
        client.timeout = seconds
        return client

    set_client_factory(with_timeout)
    try:
        yield
    finally:
        set_client_factory(previous)


def _folder_operations(folder: Path, extra_files: Mapping[str, bytes], prefix: str | None) -> list:
    """One `CommitOperationAdd` per file of `folder` (what upload_folder would send), with
    `extra_files` ({path: content}) added or put in place of the folder's own; all under `prefix`."""
    from huggingface_hub import CommitOperationAdd

    def in_repo(relative: str) -> str:
        return f"{prefix.strip('/')}/{relative}" if prefix else relative

    operations = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative in extra_files or relative.startswith((".git/", ".cache/huggingface/")):
            continue
        operations.append(CommitOperationAdd(path_in_repo=in_repo(relative), path_or_fileobj=str(path)))
    for name, data in extra_files.items():
        operations.append(CommitOperationAdd(path_in_repo=in_repo(name), path_or_fileobj=data))
    return operations


def push_folder(
    folder: str | os.PathLike,
    *,
    repo_id: str,
    private: bool,
    token: str | None = None,
    commit_message: str,
    path_in_repo: str | None = None,
    run_dir: str | os.PathLike | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    retry: str | None = None,
) -> str:
    """Create `repo_id` if needed (`private` applies only then) and upload `folder` in one commit,
    with `extra_files` ({path: content}, e.g. a model card that is not written locally) added.

    Returns the commit URL. `run_dir` (or `retry`, the whole command) only shapes the retry hint of
    the error message. Each Hub call
    says what it waits for and gives up after $DITTY_HUB_TIMEOUT_S seconds without an answer.
    Raises RecipeError (exit code 2) on any failure: missing folder, no token, HTTP error,
    connection refused, no answer in time. Nothing local is written.
    """
    folder = Path(folder)
    if retry is None:
        retry = f"ditty push {run_dir if run_dir is not None else 'RUN_DIR'}"
    retry = f"`{retry}`"
    if not folder.is_dir():
        raise RecipeError.single(
            f"nothing to push: {folder} does not exist",
            key="hub.repo_id",
            fix="push a run that finished (it writes final/), e.g. " + retry,
        )
    token = token or _current_token()
    if not token:
        raise RecipeError.single(
            f"no Hugging Face token found to push {folder} to {repo_id}; every local file is kept",
            key="hub.repo_id",
            fix=f"set HF_TOKEN or run `hf auth login`, then retry with {retry}",
        )

    from huggingface_hub import HfApi, constants

    api = HfApi(token=token)
    seconds = hub_timeout()
    waiting = ""
    try:
        with _timeouts(seconds):
            waiting = f"the Hub at {constants.ENDPOINT} to create or find the repository {repo_id}"
            print(f"waiting for {waiting} (up to {seconds:g} s)", file=sys.stderr, flush=True)
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            operations = _folder_operations(folder, dict(extra_files or {}), path_in_repo)
            waiting = f"the Hub at {constants.ENDPOINT} to take {len(operations)} files of {folder} into {repo_id}"
            print(f"waiting for {waiting} (up to {seconds:g} s without an answer)", file=sys.stderr, flush=True)
            info = api.create_commit(
                repo_id=repo_id, repo_type="model", operations=operations, commit_message=commit_message
            )
    except Exception as e:  # noqa: BLE001 - HTTP errors, refused connections, bad ids: all user-facing
        reason = _scrub(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}", token)
        if _timed_out(e):
            reason = f"no answer within {seconds:g} s while waiting for {waiting}"
        raise RecipeError.single(
            f"pushing {folder} to the Hub repository {repo_id} failed ({reason}); every local file is "
            f"kept, nothing was deleted or changed",
            key="hub.repo_id",
            fix=f"check the network, the token's write access and the repository id (a slow Hub: raise "
            f"{HUB_TIMEOUT_ENV}), then retry with {retry}",
        ) from None  # the chained traceback would only repeat the reason, with request details
    url = getattr(info, "commit_url", None) or str(info)
    log.info("pushed %s to %s (%s)", folder, repo_id, url)
    return url


def _timed_out(error: BaseException) -> bool:
    seen = error
    while seen is not None:
        if "timeout" in type(seen).__name__.lower() or isinstance(seen, TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _looks_like_hub_id(name: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name)) and not Path(name).exists()


SCORING = """import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model = AutoModelForSequenceClassification.from_pretrained(REPO_ID).eval()
tokenizer = AutoTokenizer.from_pretrained(REPO_ID)


def score(prompt, reply):
    \"\"\"The reward of `reply` to `prompt` (both strings, or chat messages), rendered as in training:
    the prompt as the chat template ends it for generation, the reply through its first eos.\"\"\"
    if isinstance(prompt, str) and isinstance(reply, str):
        prompt_ids = tokenizer(prompt)["input_ids"]
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    else:
        turns = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        answer = reply if isinstance(reply, list) else [{"role": "assistant", "content": reply}]
        head = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(turns + answer, tokenize=False)
        prompt_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(full[len(head) :], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    reply_ids = reply_ids[: reply_ids.index(eos) + 1] if eos in reply_ids else reply_ids + [eos]
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt_ids + reply_ids])).logits[0, 0].item()"""
"""How a reward model's card says to score text in plain transformers: the rendering ditty trains it on
(ditty.data.conversation), so the card's scores are the ones validation reported."""


def model_card_text(
    folder: str | os.PathLike,
    *,
    base_model: str | None,
    recipe_text: str,
    metrics: Mapping[str, Any],
    license: str = "apache-2.0",
    adapter: bool,
    title: str | None = None,
    task: str = "causal-lm",
    pipeline_tag: str = "text-generation",
    auto_class: str = "AutoModelForCausalLM",
    pipeline: str | None = "text-generation",
    peft_auto_class: str | None = "AutoPeftModelForCausalLM",
    facts: Mapping[str, str] | None = None,
) -> str:
    """The model card (README.md) for the model in `folder`: YAML front matter (base model, license,
    library, the task's pipeline tag), the final metrics, how to load the model (with the task's Auto
    class, or peft's for an adapter), and the recipe that trained it. `title` is the card's heading
    (the run name, say); `task`, `pipeline_tag`, `auto_class` and `pipeline` (the transformers.pipeline
    task, None when transformers has none) come from ditty.models.tasks."""
    folder = Path(folder)
    hub_base = base_model if base_model and _looks_like_hub_id(base_model) else None
    # JSON strings are valid YAML scalars, so names with colons or quotes need no YAML escaping.
    front = ["---"]
    if hub_base:
        front.append(f"base_model: {json.dumps(hub_base)}")
    front += [
        f"license: {json.dumps(license)}",
        f"library_name: {'peft' if adapter else 'transformers'}",
        f"pipeline_tag: {json.dumps(pipeline_tag)}",
        "tags:",
        "- ditty",
    ]
    if adapter:
        front.append("- lora")
    front.append("---")

    kind = "A LoRA adapter for" if adapter else "A finetune of"
    base_text = (
        f"[`{hub_base}`](https://huggingface.co/{hub_base})"
        if hub_base
        else f"`{base_model or 'a model trained from scratch'}`"
    )
    body = [
        f"# {title or 'A model trained with ditty'}",
        "",
        f"{kind} {base_text}, trained with ditty for the task `{task}`.",
        "",
    ]
    if facts:  # task, method, data, steps: what a reader asks first
        body += [f"- **{name}**: {value}" for name, value in facts.items()] + [""]
    if metrics:
        body += ["## Results", "", "| metric | value |", "|---|---|"]
        for name, value in metrics.items():
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            body.append(f"| {name} | {shown} |")
        body.append("")
    # Without a peft class for the task, the transformers class loads base and adapter (peft installed).
    peft_module, peft_class = ("peft", peft_auto_class) if peft_auto_class else ("transformers", auto_class)
    labels = (folder / "labels.json").is_file()  # an adapter of a classifier: its base's label maps
    if adapter and labels:
        loader = (
            f"import json\nfrom huggingface_hub import hf_hub_download\nfrom {peft_module} import {peft_class}\n"
            'labels = json.load(open(hf_hub_download(REPO_ID, "labels.json")))\n'
            'id2label = {int(i): name for i, name in labels["id2label"].items()}  # JSON keys are strings\n'
            f'model = {peft_class}.from_pretrained(REPO_ID, id2label=id2label, label2id=labels["label2id"])'
        )
    elif adapter:
        loader = f"from {peft_module} import {peft_class}\nmodel = {peft_class}.from_pretrained(REPO_ID)"
    else:
        loader = f"from transformers import {auto_class}\nmodel = {auto_class}.from_pretrained(REPO_ID)"
        if pipeline:
            loader += f'\n# or: transformers.pipeline("{pipeline}", model=REPO_ID)'
    if adapter and pipeline and (folder / "merged" / "config.json").is_file():
        # The merged model beside the adapter (written by default for a classifier) loads in one line.
        adapter_way = "\n".join("# " + line for line in loader.splitlines())
        loader = (
            "from transformers import pipeline\n# merged/: the adapter merged into its base, labels included\n"
            f'model = pipeline("{pipeline}", model="final/merged")  # a local copy of this folder\n'
            f"# or the adapter on its base:\n{adapter_way}"
        )
    body += ["## Usage", "", "```python", loader, "```", ""]
    if task == "reward-model":  # a score is only comparable to training's when the text is rendered alike
        where = "final/merged" if adapter and (folder / "merged" / "config.json").is_file() else "REPO_ID"
        body += [
            "## Scoring",
            "",
            f"Scores text as training did (`REPO_ID`: {where}):",
            "",
            "```python",
            SCORING,
            "```",
            "",
        ]
    fence = _fence(recipe_text)
    body += [
        "## Training recipe",
        "",
        "Re-run it with `ditty run recipe.toml`.",
        "",
        f"{fence}toml",
        recipe_text.rstrip("\n"),
        fence,
        "",
    ]
    return _scrub("\n".join(front + [""] + body), _current_token())


def write_model_card(folder: str | os.PathLike, **card: Any) -> Path:
    """Write `folder/README.md` (`model_card_text`'s card, same arguments); returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "README.md"
    path.write_text(model_card_text(folder, **card), encoding="utf-8")
    return path
