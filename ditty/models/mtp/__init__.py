"""Multi-token prediction (`[mtp]`): heads that draft the tokens after the next, trained beside a
causal LM, saved with it, scored by their draft acceptance and used for speculative decoding.

- support.py: which model types take heads (read by the compiler: no torch);
- heads.py: the heads (transformers' MtpLayer per depth) attached to the model, and their forward;
- capture.py: what the trunk's forward leaves for them;
- targets.py: each depth's labels, rolled within the packed samples;
- loss.py: the loss the row trains plus the heads' cross-entropy, and their held-out acceptance;
- weights.py: the heads in a saved model directory (final/, export), and loading them back;
- speculative.py: greedy decoding with the heads' drafts, verified by the model;
- converter.py: the model converter that builds (or loads) and attaches them.
"""
