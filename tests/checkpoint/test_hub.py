"""Pushing to a local stand-in for the Hub, checked on the server side; and the model card.

huggingface_hub reads HF_ENDPOINT when it is first imported, and this test session has imported it
already (offline), so every push runs in a fresh subprocess with its own environment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ditty.checkpoint.hub import write_model_card

from .fake_hub import FakeHub

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_SentinelTokenNeverWrittenAnywhere0123"
RECIPE = '[model]\npath = "tiny/llama"\n\n[train]\nsteps = 3\n'

PUSH = """
import json, logging, sys
sys.path.insert(0, {repo!r})
logging.basicConfig(level=logging.DEBUG)
from ditty.checkpoint.hub import push_folder
from ditty.config.errors import RecipeError
results = []
for attempt in range({attempts}):
    try:
        url = push_folder({folder!r}, repo_id="me/tiny-run", private=True, commit_message="ditty: final model",
                          run_dir={run!r})
        results.append({{"ok": url}})
    except RecipeError as e:
        results.append({{"error": str(e)}})
print("RESULTS " + json.dumps(results))
"""


def _push(run: Path, endpoint: str, attempts: int) -> tuple[list[dict], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HUB_DISABLE_XET="1",
        HF_TOKEN=TOKEN,
        HF_HOME=str(run / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    code = PUSH.format(repo=str(REPO), folder=str(run / "final"), run=str(run), attempts=attempts)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS ") :]), proc.stdout + proc.stderr


def _final_folder(run: Path) -> dict[str, bytes]:
    final = run / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text('{"model_type": "llama"}')
    (final / "model.safetensors").write_bytes(os.urandom(4096))
    write_model_card(
        final, base_model="tiny/llama", recipe_text=RECIPE, metrics={"loss": 1.25, "val_loss": 1.5}, adapter=False
    )
    return {p.name: p.read_bytes() for p in final.iterdir()}


def _assert_token_written_nowhere(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


@pytest.fixture
def hub():
    server = FakeHub().start()
    yield server
    server.stop()


def test_push_arrives_with_the_token_and_an_interrupted_push_can_be_retried(tmp_path, hub):
    expected = _final_folder(tmp_path)
    hub.fail_commits = 1  # the first commit dies half-way through the upload
    results, output = _push(tmp_path, hub.url, attempts=2)

    failed, retried = results
    assert "failed" in failed["error"] and "every local file is kept" in failed["error"]
    assert f"ditty push {tmp_path}" in failed["error"]
    assert retried["ok"].startswith(hub.url + "/me/tiny-run/commit/")

    # Server side: the repo was created private, every file arrived intact, in one commit.
    assert hub.repos["me/tiny-run"]["visibility"] == "private"
    assert hub.files["me/tiny-run"] == expected
    assert len(hub.commits) == 1 and hub.commits[0]["header"]["summary"] == "ditty: final model"
    card = hub.files["me/tiny-run"]["README.md"].decode()
    assert hub.validated_cards and hub.validated_cards[-1] == card  # the client checked its front matter
    assert 'base_model: "tiny/llama"' in card and "steps = 3" in card and "| val_loss | 1.5 |" in card
    # The token reached the server, in the Authorization header of every API call...
    api_calls = [r for r in hub.requests if r.path.startswith(("/api/repos", "/api/models"))]
    assert api_calls and all(
        r.headers.get("authorization", r.headers.get("Authorization")) == f"Bearer {TOKEN}" for r in api_calls
    )
    # ...and nowhere else: not in a file under the run dir (nor HF_HOME inside it), not in the output.
    _assert_token_written_nowhere(tmp_path)
    assert TOKEN not in output
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == sorted(expected)  # nothing removed


def test_connection_refused_is_a_clear_error_and_keeps_files(tmp_path):
    expected = _final_folder(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends: nothing listens
    (result,), output = _push(tmp_path, dead, attempts=1)
    assert "Connection refused" in result["error"] and "every local file is kept" in result["error"]
    assert "fix: " in result["error"] and "ditty push" in result["error"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "final").iterdir()} == expected
    assert TOKEN not in output
    _assert_token_written_nowhere(tmp_path)


def test_model_card_front_matter_recipe_and_no_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    recipe = RECIPE + "# a note with ``` inside\n# leaked: " + TOKEN + "\n"
    path = write_model_card(
        tmp_path, base_model="org/base-1b", recipe_text=recipe, metrics={"loss": 0.123456789, "steps": 3}, adapter=True
    )
    text = path.read_text()
    front = text.split("---")[1]
    assert 'base_model: "org/base-1b"' in front and 'license: "apache-2.0"' in front
    assert "library_name: peft" in front and "- lora" in front
    assert "````toml\n" in text and "steps = 3" in text  # fence longer than any run inside the recipe
    assert "| loss | 0.123457 |" in text and "AutoPeftModelForCausalLM" in text
    assert TOKEN not in text

    local = write_model_card(tmp_path / "b", base_model=str(tmp_path), recipe_text=RECIPE, metrics={}, adapter=False)
    assert "base_model:" not in local.read_text()  # a local path is not a Hub id
