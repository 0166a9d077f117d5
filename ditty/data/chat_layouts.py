"""Conversations as users have them, read into the {role, content} messages chat templates expect.

Two layouts are recognised as they are, per row, from the row's keys:

- OpenAI: a `messages` column of {"role": "user" | "assistant" | "system", "content": ...};
- ShareGPT: a `conversations` column of {"from": "human" | "gpt" | "system", "value": ...}
  ("user" and "assistant" are accepted as roles too).

Other layouts name their column with `data.messages_column` and their message keys and role names
with `data.chat_keys` ({role = "speaker", content = "text", user = "customer", assistant = "agent"}).
A row is read in one layout: a conversation whose messages mix the keys of two is a bad row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from ditty.data.rows import CHAT_ROLES, TOOL_ROLE, role_problem

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig

SHAREGPT_COLUMN = "conversations"
ROLES = CHAT_ROLES
CHAT_KEY_NAMES = ("role", "content", *ROLES)
"""The keys `data.chat_keys` accepts: the message's two keys, then the role names of other layouts."""


@dataclass(frozen=True)
class MessageKeys:
    """One layout's message keys and the role names it uses for user/assistant/system."""

    name: str
    role: str
    content: str
    role_names: Mapping[str, str] = field(default_factory=dict)
    """{the layout's role value: the chat template's role}; other values pass through unchanged."""

    def __hash__(self) -> int:  # `datasets` hashes the encoder's arguments; a frozen dataclass with a dict cannot
        return hash((self.name, self.role, self.content, tuple(sorted(self.role_names.items()))))


OPENAI = MessageKeys("OpenAI", "role", "content")
SHAREGPT = MessageKeys(
    "ShareGPT", "from", "value", {"human": "user", "gpt": "assistant", "system": "system", "bot": "assistant"}
)


@dataclass(frozen=True)
class ChatLayout:
    """Where a row keeps its conversation and how its messages read (from `data.messages_column`
    and `data.chat_keys`); a callable row rule for the row loader (ditty.data.rows.RowCheck)."""

    column: str = "messages"
    custom: Optional[MessageKeys] = None
    """The keys of `data.chat_keys`, when set: then the only layout read."""

    @classmethod
    def of(cls, data: "DataConfig") -> "ChatLayout":
        keys = dict(data.chat_keys or {})
        if not keys:
            return cls(data.messages_column)
        names = {keys[role]: role for role in ROLES if role in keys}
        return cls(
            data.messages_column,
            MessageKeys("data.chat_keys", keys.get("role", "role"), keys.get("content", "content"), names),
        )

    @property
    def missing_reason(self) -> str:
        """Why a row without a conversation column is bad (every row so: a wrong column name)."""
        return (
            f"has no {self.column!r} (OpenAI layout) or {SHAREGPT_COLUMN!r} (ShareGPT layout) column; "
            "name another with data.messages_column"
        )

    def column_of(self, found: Sequence[str]) -> str:
        """The conversation column among the `found` columns: `data.messages_column`, else ShareGPT's."""
        if self.column not in found and self.column == "messages" and SHAREGPT_COLUMN in found:
            return SHAREGPT_COLUMN
        return self.column

    def conversation(self, row: Mapping[str, Any]) -> tuple[Optional[list], Optional[str]]:
        """(the row's messages as {role, content}, None) or (None, why the row cannot be read)."""
        present = [name for name in (self.column, SHAREGPT_COLUMN) if row.get(name) is not None]
        if not present:
            return None, self.missing_reason
        column = present[0]
        turns = row[column]
        if not isinstance(turns, list):
            return None, f"{column!r} is {_kind(turns)}, not a list of messages"
        if not turns:
            return None, f"{column!r} is an empty list of messages"
        keys, problem = self._keys_of(turns[0], column)
        if problem:
            return None, problem
        messages = []
        for index, turn in enumerate(turns):
            if not isinstance(turn, dict):
                return None, f"{column!r} message {index} is {_kind(turn)}, not an object"
            role, content = turn.get(keys.role), turn.get(keys.content)
            if not isinstance(role, str) or (keys.content not in turn):
                return None, (
                    f"{column!r} message {index} has no text {keys.role!r} and {keys.content!r} "
                    f"(the row's first message is in the {keys.name} layout: {keys.role}/{keys.content})"
                )
            role = keys.role_names.get(role, role)
            roles = [message["role"] for message in messages] + [role]
            if role_problem(roles, index):  # a chat template renders any role, and a typo then trains as no one's turn
                if role == TOOL_ROLE:
                    return None, f"{column!r} {role_problem(roles, index)}"
                return None, (
                    f"{column!r} message {index} has the role {turn.get(keys.role)!r}, not user, assistant, "
                    f"system or (after an assistant turn) tool{self._role_names_hint(keys)}; map other role "
                    "names with data.chat_keys"
                )
            if turn.get("tool_calls"):  # dropped by the rendering, the turn would train as an empty reply
                return None, (
                    f"{column!r} message {index} ({role}) has 'tool_calls', which ditty's chat rendering does not "
                    "carry: write the call into the message's content as the model should emit it (the tool "
                    'episodes\' format: <tool_call>{"name": ..., "arguments": {...}}</tool_call>)'
                )
            if not isinstance(content, str):  # null would render as "None", or train an empty reply
                found = "null" if content is None else _kind(content)
                return None, f"{column!r} message {index} ({role}) has {keys.content!r} {found}, not text"
            messages.append({"role": role, "content": content})
        return messages, None

    @staticmethod
    def _role_names_hint(keys: MessageKeys) -> str:
        if not keys.role_names:
            return ""
        names = ", ".join(f"{name!r}" for name in keys.role_names)
        return f" (the {keys.name} layout's names {names} are read as those)"

    def _keys_of(self, first: Any, column: str) -> tuple[MessageKeys, Optional[str]]:
        if self.custom is not None:
            return self.custom, None
        if isinstance(first, dict):
            for keys in (OPENAI, SHAREGPT):
                if first.get(keys.role) is not None:
                    return keys, None
            return OPENAI, (
                f"{column!r} message 0 has neither 'role'/'content' (OpenAI) nor 'from'/'value' (ShareGPT) keys; "
                "name its keys with data.chat_keys"
            )
        return OPENAI, f"{column!r} message 0 is {_kind(first)}, not an object"

    def __call__(self, row: dict) -> Optional[str]:
        return self.conversation(row)[1]


def chat_keys_problems(keys: Mapping[str, Any]) -> list[str]:
    """What is wrong with `data.chat_keys` (unknown names, values that are not text)."""
    problems = [
        f"unknown key {name!r} (use {', '.join(CHAT_KEY_NAMES)})" for name in keys if name not in CHAT_KEY_NAMES
    ]
    problems += [f"{name} = {value!r} is not text" for name, value in keys.items() if not isinstance(value, str)]
    return problems


def _kind(value: Any) -> str:
    from ditty.data.rows import _a, _json_type

    return _a(_json_type(value))
