"""A DPO run killed with SIGKILL mid-accumulation resumes with bitwise-equal losses, with the reference
precomputed into the run directory (read back, not recomputed) or the adapter-disabled base."""

from __future__ import annotations

import pytest

from tests.train.test_resume import RANDOM_LLAMA, complete_steps, ditty, losses, write_recipe

PREFERENCE = '\n[preference]\nkind = "dpo"\nbeta = 0.2\nreference = "{reference}"\n'


def _recipe(tmp_path, reference: str, peft: str, out: str = "run"):
    path = write_recipe(tmp_path, f"{out}.toml", out=out, model=RANDOM_LLAMA, peft=peft)
    text = path.read_text().replace('format = "prompt_completion"', 'format = "preference"')
    path.write_text(text + PREFERENCE.format(reference=reference))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reference", "peft"), [("precompute", 'kind = "none"'), ("auto", 'kind = "lora"\nr = 4\nalpha = 8')]
)
def test_sigkill_resumes_with_bitwise_equal_losses(tmp_path, reference, peft):
    whole = ditty("run", str(_recipe(tmp_path, reference, peft, out="whole")))
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = losses(tmp_path / "whole")
    assert len(expected) == 12

    recipe = _recipe(tmp_path, reference, peft)
    killed = ditty("run", str(recipe), env={"DITTY_TEST_SIGNAL_AT": "6:1:KILL"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "run") == ["step-4"]
    table = tmp_path / "run" / "reference_logps.pt"
    written = table.stat().st_mtime_ns if reference == "precompute" else None
    resumed = ditty("run", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout
    if reference == "precompute":
        assert table.stat().st_mtime_ns == written  # read back, not computed again
    assert losses(tmp_path / "run") == expected


@pytest.mark.slow
@pytest.mark.parametrize("reference", ["precompute", "auto"])
def test_sigkill_on_two_fsdp_processes_resumes_bitwise(tmp_path, reference):
    """Two FSDP2 ranks, a full finetune: the reference is each rank's read of the precomputed table, or
    the frozen copy sharded like the policy. Micro-batch 2 on each rank: the kill lands mid-accumulation."""
    flags = ("--parallel.kind", "fsdp", "--nproc-per-node", "2", "--train.micro_batch_size", "2")
    whole = ditty("run", str(_recipe(tmp_path, reference, 'kind = "none"', out="whole")), *flags)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = losses(tmp_path / "whole")
    assert len(expected) == 12

    recipe = _recipe(tmp_path, reference, 'kind = "none"')
    killed = ditty("run", str(recipe), *flags, env={"DITTY_TEST_SIGNAL_AT": "6:1:KILL"})
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert complete_steps(tmp_path / "run") == ["step-4"]
    resumed = ditty("run", str(recipe), *flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout
    assert losses(tmp_path / "run") == expected
