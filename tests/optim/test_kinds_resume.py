"""Each new optimizer kind resumes bitwise after kill -9, through the real command line.

The run is killed mid-accumulation at step 7 (after the step-4 checkpoint) and run again; its
losses and final weights must equal an uninterrupted run's exactly. For schedule-free AdamW this
also covers the train/eval switch: the checkpoint holds the evaluation weights and the resumed run
switches back to the training weights exactly as the uninterrupted run did after its save.
"""

from __future__ import annotations

import pytest
import torch

from tests.train.test_resume import complete_steps, ditty, losses, write_recipe

KINDS = {
    "radam": ["--optimizer.kind", "radam", "--optimizer.weight_decay", "0.1"],
    "muon": ["--optimizer.kind", "muon", "--optimizer.weight_decay", "0.1"],
    "adafactor": ["--optimizer.kind", "adafactor", "--optimizer.lr", "0.01"],
    "adamw_schedulefree": ["--optimizer.kind", "adamw_schedulefree", "--scheduler.kind", "constant"],
}


def final_weights(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_kill_9_then_resume_is_bitwise_equal(tmp_path, kind):
    flags = KINDS[kind]
    reference_recipe = write_recipe(tmp_path, "reference.toml", out="reference")
    done = ditty("run", str(reference_recipe), *flags)
    assert done.returncode == 0, done.stderr[-3000:]

    recipe = write_recipe(tmp_path)
    killed = ditty("run", str(recipe), *flags, env={"DITTY_TEST_SIGNAL_AT": "6:1:KILL"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "run") == ["step-4"]
    resumed = ditty("run", str(recipe), *flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout

    assert losses(tmp_path / "run") == losses(tmp_path / "reference")
    expected, got = final_weights(tmp_path / "reference"), final_weights(tmp_path / "run")
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
