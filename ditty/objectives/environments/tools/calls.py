"""Tool calls in a model's text, in the format its chat template writes them.

- "hermes" (the default; Hermes, Qwen 2.5 and 3, and ditty's templates): each call is
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- "mistral": `[TOOL_CALLS]` followed by a JSON list of {"name", "arguments"} objects;
- "llama3": the turn is one JSON object {"name": ..., "parameters": {...}} (Llama 3.1's JSON calls),
  optionally after `<|python_tag|>`.

`call_format_for(chat_template)` picks the format whose marker the template holds. `parse(text)`
gives every call the text attempts, each either well formed (a name and a dict of arguments) or
with the reason it is not; a text that attempts no call is the model's final answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class ToolCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    """Why the call is malformed (then `name` may be empty), or None."""


def _call_from(value: Any, arguments_key: str = "arguments") -> ToolCall:
    if not isinstance(value, dict):
        return ToolCall(error=f"a tool call is a JSON object, not {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(error='a tool call needs a "name"')
    arguments = value.get(arguments_key, {})
    if isinstance(arguments, str):  # OpenAI's layout: the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as error:
            return ToolCall(name=name, error=f"the arguments are not JSON ({error.msg})")
    if not isinstance(arguments, dict):
        return ToolCall(name=name, error=f'"{arguments_key}" is a {type(arguments).__name__}, not an object')
    return ToolCall(name=name, arguments=arguments)


def _json(text: str) -> tuple[Any, Optional[str]]:
    try:
        return json.loads(text), None
    except json.JSONDecodeError as error:
        return None, f"the call is not JSON ({error.msg} at character {error.pos})"


class HermesCalls:
    name = "hermes"
    marker = "<tool_call>"
    _call = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for match in self._call.finditer(text):
            if not match.group(2):
                calls.append(ToolCall(error="<tool_call> is not closed by </tool_call>"))
                continue
            value, error = _json(match.group(1).strip())
            calls.append(ToolCall(error=error) if error else _call_from(value))
        return calls

    def write(self, name: str, arguments: dict) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class MistralCalls:
    name = "mistral"
    marker = "[TOOL_CALLS]"

    def parse(self, text: str) -> list[ToolCall]:
        if self.marker not in text:
            return []
        value, error = _json(text.split(self.marker, 1)[1].strip())
        if error:
            return [ToolCall(error=error)]
        values = value if isinstance(value, list) else [value]
        return [_call_from(item) for item in values] or [ToolCall(error="[TOOL_CALLS] holds no call")]

    def write(self, name: str, arguments: dict) -> str:
        return f"{self.marker}{json.dumps([{'name': name, 'arguments': arguments}])}"


class Llama3Calls:
    name = "llama3"
    marker = "<|python_tag|>"

    def parse(self, text: str) -> list[ToolCall]:
        body = text.split(self.marker, 1)[1] if self.marker in text else text
        body = body.strip()
        if not body.startswith("{"):
            return []
        value, error = _json(body)
        return [ToolCall(error=error)] if error else [_call_from(value, "parameters")]

    def write(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "parameters": arguments})


CALL_FORMATS = {f.name: f for f in (HermesCalls(), MistralCalls(), Llama3Calls())}


def call_format_for(chat_template: Optional[str]) -> Any:
    """The format the chat template writes calls in (its marker), Hermes when it names none."""
    for form in (MistralCalls(), Llama3Calls(), HermesCalls()):
        if chat_template and form.marker in chat_template:
            return form
    return HermesCalls()
