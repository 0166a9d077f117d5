"""Chat templates for tokenizers that have none (`tokenizer.chat_template`): a named one, or a Jinja file.

The named templates mark each assistant turn with `{% generation %}`, so the chat format learns
exactly the assistant's tokens and the end of its turn (eos), which `ditty generate` stops on.
"""

from __future__ import annotations

import os
from typing import Optional

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% if eos_token %}{{ eos_token }}{% endif %}"
    "{% endgeneration %}"
    "{% else %}"
    "{{ message['content'] + '<|im_end|>' }}"
    "{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, as Qwen and many finetunes write it; `<|im_start|>`/`<|im_end|>` are text unless the
tokenizer has them as tokens, and eos ends each assistant turn."""

PLAIN = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ message['role'] }}: "
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}{% if eos_token %}{{ eos_token }}{% endif %}{% endgeneration %}"
    "{% else %}"
    "{{ message['content'] }}"
    "{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""One line per turn, "role: content" (the byte tokenizer's own template)."""

CHAT_TEMPLATES = {"chatml": CHATML, "plain": PLAIN}


def chat_template_problem(choice: str) -> Optional[str]:
    """Why `tokenizer.chat_template` names neither a template nor a readable file, or None."""
    if choice in CHAT_TEMPLATES or os.path.isfile(os.path.expanduser(choice)):
        return None
    return f"{choice!r} is neither a named template ({', '.join(CHAT_TEMPLATES)}) nor a Jinja file"


def chat_template_text(choice: str) -> str:
    """The Jinja text `tokenizer.chat_template` names."""
    if choice in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[choice]
    with open(os.path.expanduser(choice), encoding="utf-8") as handle:
        return handle.read()
