"""The stages of a training step: batch -> preprocessors -> model -> postprocessors -> loss.

processors.py holds the `PreProcessor`/`PostProcessor` base types and the step's `Context`;
loss.py the `LossCalculator` base, the causal-LM loss and the original Ditty's losses;
task_losses.py the model tasks' losses; fused_loss/ the loss computed from the output head's
input in chunks (no full logits); diffusion.py the noise schedule and its preprocessor.
Importing this package imports none of them (the recipe compiler imports what it checks).
"""
