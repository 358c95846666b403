"""A user's prompt file, in the forms people already keep prompts in, detected by content.

    JSONL or JSON records with OpenAI-style `messages` (system / user / assistant turns; the model
        answers after the last user turn, so later turns are left out)
    JSONL or JSON records with `prompt` (optional `system`, `category`, `id`)
    ShareGPT JSON: records with `conversations` of {"from": "human" | "gpt" | "system", "value": ...}
    CSV with a `prompt` column (optional `system`, `category`, `id` columns)
    plain text: prompts separated by blank lines

Anything unreadable is a PromptFileError of one line that names the record and the reason
("line 7: not JSON", "record 12: no prompt"). Limits on how many prompts and how long each may be
are settings (PromptLimits), so a public page can refuse a file that would run for hours.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from playground.engines.request import GenerationRequest
from playground.errors import PlaygroundError

CSV_DELIMITERS = (",", ";", "\t")
OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "assistant": "assistant", "model": "assistant", "system": "system"}


class PromptFileError(PlaygroundError):
    """A prompt file that cannot be read, in one line."""


class NotJSONLines(PromptFileError):
    """A line that is not JSON, in a file that begins as JSON lines."""

    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class PromptLimits:
    max_prompts: int = 1000
    max_prompt_chars: int = 32_000      # the system prompt and earlier turns included
    max_file_bytes: int = 20 * 2**20


@dataclass(frozen=True)
class UserPrompt:
    """One prompt of the file: the user message the model answers, with the turns before it."""
    id: str
    prompt: str
    system: str | None = None
    history: tuple[dict, ...] = ()      # earlier turns, {"role", "content"}, alternating user / assistant
    category: str | None = None

    @property
    def chars(self) -> int:
        return len(self.prompt) + len(self.system or "") + sum(len(m["content"]) for m in self.history)

    def request(self, drafter: str, k: int, max_tokens: int) -> GenerationRequest:
        return GenerationRequest(prompt=self.prompt, system=self.system, history=self.history, drafter=drafter,
                                 k=k, max_tokens=max_tokens)


@dataclass(frozen=True)
class PromptFile:
    format: str
    prompts: tuple[UserPrompt, ...]

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.category for p in self.prompts if p.category))


def read_prompts(data: bytes | str, limits: PromptLimits = PromptLimits(), sample: int | None = None,
                 seed: int = 0) -> PromptFile:
    """The prompts in `data` (a file's bytes or text); with `sample`, that many drawn at random (seeded,
    in file order). The limits apply to what would run."""
    if isinstance(data, bytes):
        if len(data) > limits.max_file_bytes:
            raise PromptFileError(f"the file is {size(len(data))}; the limit is {size(limits.max_file_bytes)}")
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise PromptFileError(f"the file is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}); "
                                  "save it as UTF-8") from None
    if not data.strip():
        raise PromptFileError("the file is empty")
    form, prompts = _parse(data)
    if not prompts:
        raise PromptFileError("the file holds no prompts")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise PromptFileError(f"the id {twice!r} names two prompts")
    if sample is not None:
        if sample < 1:
            raise PromptFileError(f"the sample must be at least 1 prompt, got {sample}")
        if sample < len(prompts):
            keep = sorted(random.Random(seed).sample(range(len(prompts)), sample))
            prompts = [prompts[i] for i in keep]
    if len(prompts) > limits.max_prompts:
        raise PromptFileError(f"the file has {len(prompts):,} prompts; the limit is {limits.max_prompts:,} "
                              "(run a sample of them)")
    for p in prompts:
        if p.chars > limits.max_prompt_chars:
            raise PromptFileError(f"{p.id}: the prompt is {p.chars:,} characters; the limit is "
                                  f"{limits.max_prompt_chars:,}")
    return PromptFile(form, tuple(prompts))


def size(n: int) -> str:
    """A byte count for a message: 20 MiB, 300 KiB, 10 bytes."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def _parse(text: str) -> tuple[str, list[UserPrompt]]:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = text.lstrip()
    if re.match(r'\{\s*["}]', start):   # JSON lines; else one JSON object written over several lines
        try:
            return _records(_json_lines(text), "line")
        except NotJSONLines as e:
            try:
                whole = json.loads(text)
            except json.JSONDecodeError as whole_error:
                raise (e if e.line > 1 else
                       PromptFileError(f"not JSON: {whole_error.msg} at line {whole_error.lineno}, "
                                       f"column {whole_error.colno}")) from None
            return _records([(1, whole)], "record")
    if re.match(r'\[\s*([{\["\]0-9-]|true|false|null)', start):   # a JSON array ("[INST] ..." is text)
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
        return _records(list(enumerate(records, 1)), "record")
    first_line = start.split("\n", 1)[0]
    for delimiter in CSV_DELIMITERS:
        if "prompt" in (cell.strip().lower() for cell in next(csv.reader([first_line], delimiter=delimiter), [])):
            return "csv", _csv(start, delimiter)
    blocks = (b.strip() for b in re.split(r"\n[ \t]*\n", text))
    return "text", [UserPrompt(f"prompt {i}", b) for i, b in enumerate((b for b in blocks if b), 1)]


def _json_lines(text: str) -> list[tuple[int, Any]]:
    records = []
    for n, line in enumerate(text.split("\n"), 1):   # not splitlines: U+2028 and the like are legal in JSON strings
        if not line.strip():
            continue
        try:
            records.append((n, json.loads(line)))
        except json.JSONDecodeError:
            raise NotJSONLines(f"line {n}: not JSON", n) from None
    return records


def _records(numbered: list[tuple[int, Any]], unit: str) -> tuple[str, list[UserPrompt]]:
    """Prompts from JSON records; every record of a file must be of the file's one kind."""
    forms, prompts = set(), []
    for n, record in numbered:
        where = f"{unit} {n}"
        if not isinstance(record, dict):
            raise PromptFileError(f"{where}: not a JSON object")
        if "messages" in record:
            form, prompt = "messages", _turns(where, record["messages"], "role", "content", None)
        elif "conversations" in record:
            form, prompt = "sharegpt", _turns(where, record["conversations"], "from", "value", SHAREGPT_ROLES)
        elif "prompt" in record:
            form, prompt = "prompt records", _with_system(where, _text(where, record["prompt"], "prompt"),
                                                          record.get("system"))
        else:
            raise PromptFileError(f"{where}: no prompt (a record needs \"prompt\", \"messages\" or \"conversations\")")
        forms.add(form)
        if len(forms) > 1:
            raise PromptFileError(f"{where}: a {form} record in a file of {forms.difference([form]).pop()} records")
        prompts.append(_identified(where, prompt, record.get("id"), record.get("category")))
    return (forms.pop() if forms else "prompt records"), prompts


def _text(where: str, value: Any, field: str) -> str:
    """A message's text: a string, or OpenAI's list of content parts of which the text ones count."""
    if value is None:
        raise PromptFileError(f"{where}: no {field}")
    if isinstance(value, list):
        value = "".join(part["text"] for part in value
                        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str))
    if not isinstance(value, str):
        raise PromptFileError(f"{where}: {field} is not text")
    if not value.strip():
        raise PromptFileError(f"{where}: {field} is empty")
    return value


def _with_system(where: str, prompt: str, system: Any) -> UserPrompt:
    if system is not None and not isinstance(system, str):
        raise PromptFileError(f"{where}: system is not text")
    return UserPrompt(where, prompt, system or None)


def _turns(where: str, turns: Any, role_key: str, text_key: str, roles: dict[str, str] | None) -> UserPrompt:
    """`roles` maps the file's role names to system / user / assistant (None: OpenAI's)."""
    """The conversation up to its last user turn: the system turn, the earlier turns, and the prompt."""
    if not isinstance(turns, list) or not turns:
        raise PromptFileError(f"{where}: the conversation is not a list of turns")
    messages = []
    for i, turn in enumerate(turns, 1):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise PromptFileError(f"{where}: turn {i} has no {role_key!r} and {text_key!r}")
        role = (roles or OPENAI_ROLES).get(str(turn[role_key]).lower())
        if role not in ("system", "user", "assistant"):
            raise PromptFileError(f"{where}: turn {i} has the unknown {role_key} {turn[role_key]!r}")
        messages.append({"role": role, "content": _text(where, turn[text_key], f"turn {i}")})
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise PromptFileError(f"{where}: the conversation has no user turn")
    system = [m["content"] for m in messages[:last_user] if m["role"] == "system"]
    history = tuple(m for m in messages[:last_user] if m["role"] != "system")
    return UserPrompt(where, messages[last_user]["content"], "\n\n".join(system) or None, history)


def _identified(where: str, prompt: UserPrompt, given_id: Any, category: Any) -> UserPrompt:
    if category is not None and not isinstance(category, (str, int)):
        raise PromptFileError(f"{where}: category is not text")
    return UserPrompt(str(given_id) if given_id not in (None, "") else where, prompt.prompt, prompt.system,
                      prompt.history, str(category) if category not in (None, "") else None)


def _csv(text: str, delimiter: str) -> list[UserPrompt]:
    reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
    reader.fieldnames = [(f or "").strip().lower() for f in reader.fieldnames or []]
    prompts = []
    for row in reader:
        where = f"row {reader.line_num}"
        if None in row:
            raise PromptFileError(f"{where}: more cells than the header has columns")
        if not any((v or "").strip() for v in row.values()):
            continue
        prompt = _with_system(where, _text(where, row.get("prompt"), "prompt"), (row.get("system") or "").strip())
        prompts.append(_identified(where, prompt, (row.get("id") or "").strip(), (row.get("category") or "").strip()))
    return prompts
