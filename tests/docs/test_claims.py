"""Claims of the docs that a test of the code holds, said where the reader meets the setting: a key
that only some backends take says which, and an equality of runs says when it holds."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _paragraphs(page: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", (ROOT / "docs" / page).read_text(encoding="utf-8")) if p.strip()]


def test_rl_md_says_the_async_keys_need_a_vllm_backend():
    """rl.md offered rollout.max_staleness and rollout.sampler_correction without saying that `ditty check`
    refuses both with the default "generate" backend (tests/rl/test_rl_recipe.py holds the refusal);
    the vLLM page, which now holds their details, says it wherever it names them too."""
    for page in ("objectives/rl.md", "objectives/vllm.md"):
        for key in ("rollout.max_staleness", "rollout.sampler_correction"):
            where = [p for p in _paragraphs(page) if f"`{key}" in p]
            assert where, (page, key)
            for paragraph in where:
                assert "vLLM backend" in paragraph, f"{page}: {key} without its backend:\n{paragraph}"


def test_tools_md_says_when_two_ranks_play_the_episodes_of_one_process():
    """tools.md said 2 ranks equal 1 process: that holds when rollout.generation_batch_size divides each
    rank's prompts (tests/rl/test_rl_ddp.py runs it at 1), since a generation call is seeded by its
    first prompt's position."""
    where = [p for p in _paragraphs("objectives/tools.md") if "1 process" in p or "one process" in p]
    assert where
    for paragraph in where:
        assert "rollout.generation_batch_size" in paragraph, paragraph
