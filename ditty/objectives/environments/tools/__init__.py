"""The built-in tool environment (`[rl] tools`): `tool_environment` plays Python functions as tools;
`calls` parses calls in the chat template's format; `builtin_tools` holds ready-made tools;
`process` and `worker` run them in a worker process (`rl.tools_isolation = "process"`)."""
