"""The original Ditty library's Python API, over ditty's one Trainer.

`Pipeline` (pipeline.py) turns the original's keyword arguments (pipeline_options.py) into a
recipe and runs the Trainer; `ModelFactory` and its config objects (model_factory.py,
model_configs.py) say where the model comes from; `Data` (data.py) makes a DataLoader from a
Hugging Face dataset; porting.py and metrics_logger.py hold the original's checkpoint readers,
`print_pipeline` and `MetricsLogger`. Users import these names from `ditty` (and the original's
module names, `ditty.pipeline`, `ditty.model_factory`, ..., still work: ditty.MOVED_MODULES).

Nothing outside this package imports it: the core does not depend on the compatibility layer
(tests/test_layers.py holds that).
"""

from ditty._utils.quiet import quiet_libraries

# As the `ditty` commands do: the libraries' import-time noise (torchao's optional kernels, torch's
# pytree notices), which this package's imports set off, stays hidden unless DITTY_VERBOSE=1.
quiet_libraries()
