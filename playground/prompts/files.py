"""A user's prompt file, in the forms people already keep prompts in, detected by content.

    JSONL or JSON records with OpenAI-style `messages` (system / user / assistant turns; the model
        answers after the last user turn, so later turns are left out)
    JSONL or JSON records with `prompt` (optional `system`, `category`, `id`, `document`)
    ShareGPT JSON: records with `conversations` of {"from": "human" | "gpt" | "system", "value": ...}
    CSV with a `prompt` column (optional `system`, `category`, `id`, `document` columns)
    plain text: prompts separated by blank lines (also under a first line that is `prompt` alone)

Anything unreadable is a PromptFileError of one line that names the record and the reason
("line 7: not JSON", "record 12: no prompt"). Limits on how many prompts and how long each may be
are settings (PromptLimits), so a public page can refuse a file that would run for hours. They also
bound the reading itself: the size is checked before anything is read, and the prompts are counted
as the file is read, which stops one past the most it may hold.

Every record may name its `document`: prompts that ask about one text name the same one, and a report's
intervals then resample that document's prompts together (they are not independent of each other).
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from playground.engines.request import GenerationRequest
from playground.errors import PlaygroundError

CSV_DELIMITERS = (",", ";", "\t")
CSV_COLUMNS = ("prompt", "system", "id", "category", "document")   # the columns read; others are left alone
OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "assistant": "assistant", "model": "assistant", "system": "system"}
SPACE = re.compile(r"\s*")
BLANK_LINES = re.compile(r"\n\s*\n")            # greedy: a run of blank lines is one match, however long
LINE = re.compile(r"[^\n]*\n|[^\n]+")           # a line as the csv module reads it, "\n" kept
FILLED_LINE = re.compile(r"^.*\S.*$", re.M)     # "." stops at "\n" only: U+2028 and the like are legal in JSON strings
JSON_OBJECT = re.compile(r'\{\s*["}]')          # JSON lines, or one object written over several lines
JSON_ARRAY = re.compile(r'\[\s*([{\["\]0-9-]|true|false|null)')   # "[INST] ..." is text
JSON_SPACE = re.compile(r"[ \t\n\r]*")
DECODER = json.JSONDecoder()


class PromptFileError(PlaygroundError):
    """A prompt file that cannot be read, in one line; its setting is the page's file control (or the sample)."""

    def __init__(self, message: str, setting: str = "file"):
        super().__init__(message, setting)


class NotJSONLines(PromptFileError):
    """A line that is not JSON, in a file that begins as JSON lines."""


@dataclass(frozen=True)
class PromptLimits:
    max_prompts: int = 1000             # prompts that run
    max_prompt_chars: int = 32_000      # the system prompt and earlier turns included
    max_file_bytes: int = 20 * 2**20
    max_sampled_from: int = 100_000     # prompts a file may hold when a sample of it runs: all are read to draw it


@dataclass(frozen=True)
class UserPrompt:
    """One prompt of the file: the user message the model answers, with the turns before it."""
    id: str
    prompt: str
    system: str | None = None
    history: tuple[dict, ...] = ()      # earlier turns, {"role", "content"}, alternating user / assistant
    category: str | None = None
    document: str | None = None         # the text it asks about, where other prompts ask about it too

    @property
    def chars(self) -> int:
        return len(self.prompt) + len(self.system or "") + sum(len(m["content"]) for m in self.history)

    def request(self, drafter: str, k: int, max_tokens: int) -> GenerationRequest:
        return GenerationRequest(prompt=self.prompt, system=self.system, history=self.history, drafter=drafter,
                                 k=k, max_tokens=max_tokens)


@dataclass(frozen=True)
class PromptFile:
    format: str    # its kind of records ("messages", "csv", ...); a JSON file mixing kinds names each, joined by " + "
    prompts: tuple[UserPrompt, ...]

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.category for p in self.prompts if p.category))


def read_prompt_file(path: str | os.PathLike, limits: PromptLimits = PromptLimits(), sample: int | None = None,
                     seed: int = 0) -> PromptFile:
    """The prompts of the file at `path`, as read_prompts reads them; a file over the size limit is not read."""
    try:
        with open(path, "rb") as f:
            _check_bytes(os.fstat(f.fileno()).st_size, "file", limits)
            data = f.read(limits.max_file_bytes + 1)   # one byte more than the limit: a file grown since is refused
    except OSError as e:
        raise PromptFileError(f"cannot read the file: {e.strerror}") from None
    return read_prompts(data, limits, sample, seed)


def read_prompts(data: bytes | str, limits: PromptLimits = PromptLimits(), sample: int | None = None,
                 seed: int = 0) -> PromptFile:
    """The prompts in `data` (a file's bytes or pasted text); with `sample`, that many drawn at random (seeded,
    in file order). The limits apply to what would run; reading stops one prompt past the most the file may
    hold: `max_prompts`, or with a sample `max_sampled_from`."""
    check_size(data, limits)
    if sample is not None and not 1 <= sample <= limits.max_prompts:
        raise PromptFileError(f"the sample must be 1 to {limits.max_prompts:,} prompts, got {sample:,}", "sample")
    text = _decoded(data) if isinstance(data, bytes) else data
    if not text or text.isspace():
        raise PromptFileError("the file is empty")
    most = limits.max_prompts if sample is None else limits.max_sampled_from
    forms, prompts, ids = {}, [], set()
    for form, prompt in _parse(text):
        forms[form] = True
        if prompt.id in ids:
            raise PromptFileError(f"the id {_shown(prompt.id)} names two prompts")
        ids.add(prompt.id)
        prompts.append(prompt)
        if len(prompts) > most:
            raise PromptFileError(f"the file has more than {most:,} prompts; the limit is {most:,}"
                                  + (" (run a sample of them)" if sample is None else " to draw a sample from"))
    if not prompts:
        raise PromptFileError("the file holds no prompts")
    if sample is not None and sample < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), sample))
        prompts = [prompts[i] for i in keep]
    for p in prompts:
        if p.chars > limits.max_prompt_chars:
            raise PromptFileError(f"{p.id}: the prompt is {p.chars:,} characters; the limit is "
                                  f"{limits.max_prompt_chars:,}")
    return PromptFile(" + ".join(forms), tuple(prompts))


def check_size(data: bytes | str, limits: PromptLimits) -> None:
    """A PromptFileError if `data` (a file's bytes, or pasted text as UTF-8) is over the size limit."""
    if isinstance(data, bytes):
        _check_bytes(len(data), "file", limits)
    else:
        _check_bytes(len(data.encode("utf-8", "surrogatepass")), "pasted text", limits)


def size(n: int) -> str:
    """A byte count for a message: 8 GiB, 20 MiB, 300 KiB, 10 bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def _check_bytes(n: int, what: str, limits: PromptLimits) -> None:
    if n > limits.max_file_bytes:
        raise PromptFileError(f"the {what} is {size(n)}; the limit is {size(limits.max_file_bytes)}")


def _decoded(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"the file is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}); "
                              "save it as UTF-8") from None


def _parse(text: str) -> Iterator[tuple[str, UserPrompt]]:
    """The file's prompts one at a time, each with the file's form."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    begin = SPACE.match(text).end()
    if JSON_OBJECT.match(text, begin):
        return _records(_json_lines(text))
    if JSON_ARRAY.match(text, begin):
        return _records(_json_array(text, begin))
    line_end = text.find("\n", begin)
    first_line = text[begin:line_end if line_end >= 0 else len(text)]
    for delimiter in CSV_DELIMITERS:
        header = _csv_header(first_line, delimiter)
        if "prompt" in header and not (header == ["prompt"] and _paragraphs(text, begin + len(first_line))):
            return _csv(text, begin, delimiter)
    return (("text", UserPrompt(f"prompt {i}", block)) for i, block in enumerate(_blocks(text), 1))


def _paragraphs(text: str, start: int) -> bool:
    """Whether the text from `start` holds blank lines between prompts and no quoted CSV cell: under a lone
    `prompt` first line, plain text (one column of CSV has no use for blank lines, short of a quoted cell
    holding them)."""
    gap = BLANK_LINES.search(text, start)
    return gap is not None and SPACE.match(text, gap.end()).end() < len(text) and text.find('"', start) < 0


def _blocks(text: str) -> Iterator[str]:
    """The prompts of plain text: what blank lines separate."""
    start = 0
    for gap in BLANK_LINES.finditer(text):
        if block := text[start:gap.start()].strip():
            yield block
        start = gap.end()
    if block := text[start:].strip():
        yield block


def _json_lines(text: str) -> Iterator[tuple[str, Any]]:
    """Records of JSON lines; when the first line is not JSON, the one object written over several lines."""
    lines = _each_json_line(text)
    try:
        first = next(lines)
    except NotJSONLines:
        lines, first = iter(()), ("record 1", _whole_json(text))
    yield first
    yield from lines


def _each_json_line(text: str) -> Iterator[tuple[str, Any]]:
    number, counted = 1, 0
    for line in FILLED_LINE.finditer(text):
        number += text.count("\n", counted, line.start())
        counted = line.start()
        where = f"line {number}"
        try:
            record = json.loads(line.group())
        except json.JSONDecodeError:
            raise NotJSONLines(f"{where}: not JSON") from None
        except (RecursionError, ValueError) as e:
            raise _unreadable(where, e) from None
        yield where, record


def _whole_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PromptFileError(_syntax(e)) from None
    except (RecursionError, ValueError) as e:
        raise _unreadable("record 1", e) from None


def _json_array(text: str, begin: int) -> Iterator[tuple[str, Any]]:
    """The records of the JSON array at `begin` one at a time, so that reading stops where the limits do."""
    at, n = _json_space(text, begin + 1), 0
    while not text.startswith("]", at):
        if n:
            if not text.startswith(",", at):
                raise PromptFileError(_syntax(json.JSONDecodeError("Expecting ',' delimiter", text, at)))
            at = _json_space(text, at + 1)
        n += 1
        try:
            record, at = DECODER.raw_decode(text, at)
        except json.JSONDecodeError as e:
            raise PromptFileError(_syntax(e)) from None
        except (RecursionError, ValueError) as e:
            raise _unreadable(f"record {n}", e) from None
        yield f"record {n}", record
        at = _json_space(text, at)
    at = _json_space(text, at + 1)
    if at < len(text):
        raise PromptFileError(_syntax(json.JSONDecodeError("Extra data", text, at)))


def _json_space(text: str, at: int) -> int:
    return JSON_SPACE.match(text, at).end()


def _syntax(error: json.JSONDecodeError) -> str:
    return f"not JSON: {error.msg} at line {error.lineno}, column {error.colno}"


def _unreadable(where: str, error: RecursionError | ValueError) -> PromptFileError:
    """Well-formed JSON that Python does not read: nested past its recursion limit, or a number of more digits
    than it converts (its only ValueError besides JSONDecodeError)."""
    if isinstance(error, RecursionError):
        return PromptFileError(f"{where}: JSON nested too deeply")
    return PromptFileError(f"{where}: a number of more than {sys.get_int_max_str_digits():,} digits")


def _records(numbered: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, UserPrompt]]:
    """Prompts from JSON records, each of its own kind: a file may mix them."""
    for where, record in numbered:
        if not isinstance(record, dict):
            raise PromptFileError(f"{where}: not a JSON object")
        if "messages" in record:
            form, (prompt, system, history) = "messages", _turns(where, record["messages"], "role", "content",
                                                                 OPENAI_ROLES)
        elif "conversations" in record:
            form, (prompt, system, history) = "sharegpt", _turns(where, record["conversations"], "from", "value",
                                                                 SHAREGPT_ROLES)
        elif "prompt" in record:
            form, history = "prompt records", ()
            prompt, system = _text(where, record["prompt"], "prompt"), _system(where, record.get("system"))
        else:
            raise PromptFileError(f"{where}: no prompt (a record needs \"prompt\", \"messages\" or \"conversations\")")
        yield form, _prompt(where, record.get("id"), prompt, system, history, record.get("category"),
                            record.get("document"))


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


def _system(where: str, system: Any) -> str | None:
    if system is not None and not isinstance(system, str):
        raise PromptFileError(f"{where}: system is not text")
    return system or None


def _turns(where: str, turns: Any, role_key: str, text_key: str,
           roles: dict[str, str]) -> tuple[str, str | None, tuple[dict, ...]]:
    """The conversation up to its last user turn: the prompt, the system turns, and the turns between. `roles`
    maps the file's role names to system / user / assistant."""
    if not isinstance(turns, list) or not turns:
        raise PromptFileError(f"{where}: the conversation is not a list of turns")
    messages = []
    for i, turn in enumerate(turns, 1):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise PromptFileError(f"{where}: turn {i} has no {role_key!r} and {text_key!r}")
        named = turn[role_key]
        role = roles.get(named.lower()) if isinstance(named, str) else None
        if role is None:
            raise PromptFileError(f"{where}: turn {i} has the unknown {role_key} {_shown(named)}")
        messages.append({"role": role, "content": _text(where, turn[text_key], f"turn {i}")})
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise PromptFileError(f"{where}: the conversation has no user turn")
    system = [m["content"] for m in messages[:last_user] if m["role"] == "system"]
    history = tuple(m for m in messages[:last_user] if m["role"] != "system")
    return messages[last_user]["content"], "\n\n".join(system) or None, history


def _prompt(where: str, given_id: Any, prompt: str, system: str | None, history: tuple[dict, ...],
            category: Any, document: Any) -> UserPrompt:
    """The prompt under its id, or where it is when the file gives none."""
    for name, value in (("id", given_id), ("category", category), ("document", document)):
        if value is not None and not isinstance(value, (str, int)):
            raise PromptFileError(f"{where}: {name} is not text")
    named = lambda value: str(value) if value not in (None, "") else None
    return UserPrompt(named(given_id) or where, prompt, system, history, named(category), named(document))


def _shown(value: Any) -> str:
    """A value of the file as a message quotes it: a scalar's repr cut short, else its kind."""
    shown = repr(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return shown if len(shown) <= 60 else shown[:59] + "…"


def _csv_header(line: str, delimiter: str) -> list[str]:
    if "prompt" not in line.lower():
        return []
    try:
        return [cell.strip().lower() for cell in next(csv.reader([line], delimiter=delimiter), [])]
    except csv.Error:   # e.g. a line longer than the csv module's field limit: not a header
        return []


def _csv(text: str, begin: int, delimiter: str) -> Iterator[tuple[str, UserPrompt]]:
    lines = (line.group() for line in LINE.finditer(text, begin))   # not io.StringIO: it holds 4 bytes a character
    reader = csv.reader(lines, delimiter=delimiter)   # not DictReader: it walks every column of the header per row
    read = 0   # lines of the rows read whole
    try:
        header = [cell.strip().lower() for cell in next(reader, [])]
        columns = {name: header.index(name) for name in CSV_COLUMNS if name in header}
        for row in reader:
            read = reader.line_num
            where = f"row {read}"
            if len(row) > len(header):
                raise PromptFileError(f"{where}: more cells than the header has columns")
            if not any(cell.strip() for cell in row):
                continue
            cell = {name: row[i] if i < len(row) else None for name, i in columns.items()}
            yield "csv", _prompt(where, (cell.get("id") or "").strip(), _text(where, cell.get("prompt"), "prompt"),
                                 (cell.get("system") or "").strip() or None, (), (cell.get("category") or "").strip(),
                                 (cell.get("document") or "").strip())
    except csv.Error as e:
        failed_at = max(read, 1) + 1
        if "field limit" in str(e):
            raise PromptFileError(f"row {failed_at}: a cell holds more than {csv.field_size_limit():,} characters, "
                                  "more than a CSV cell may hold here") from None
        raise PromptFileError(f"row {failed_at}: not CSV ({e})") from None
