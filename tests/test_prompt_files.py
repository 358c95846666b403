"""Prompt files in every supported form, and every way one can be unreadable: one line naming the record."""

import json
import time
import tracemalloc

import pytest

from playground.prompts.files import PromptFileError, PromptLimits, read_prompt_file, read_prompts
from playground.prompts.sets import ASSETS


def jsonl(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def test_a_json_lines_file_may_mix_kinds_of_records():
    f = read_prompts(b'{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n{"prompt": "c"}\n')
    assert f.format == "prompt records + messages" and [p.prompt for p in f.prompts] == ["a", "b", "c"]


def test_openai_messages_answer_after_the_last_user_turn():
    data = jsonl({"id": "a", "category": "code", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Write a sort."},
        {"role": "assistant", "content": "sorted(xs)"},
        {"role": "user", "content": [{"type": "text", "text": "Now descending."}, {"type": "image_url"}]},
        {"role": "assistant", "content": "an answer the model will write itself"}]},
        {"messages": [{"role": "user", "content": "Hi"}]})
    f = read_prompts(data)
    first, second = f.prompts
    assert f.format == "messages" and f.categories == ("code",)
    assert (first.id, first.prompt, first.system, first.category) == ("a", "Now descending.", "Be brief.", "code")
    assert first.history == ({"role": "user", "content": "Write a sort."}, {"role": "assistant", "content": "sorted(xs)"})
    assert (second.id, second.system, second.history) == ("line 2", None, ())
    request = first.request("eagle3", 5, 32)
    assert request.messages[-1] == {"role": "user", "content": "Now descending."} and len(request.messages) == 4


def test_prompt_records_as_jsonl_and_as_a_json_array():
    records = [{"prompt": "One", "system": "S", "category": "x", "id": 7}, {"prompt": "Two"}]
    for data in (jsonl(*records), json.dumps(records).encode()):
        f = read_prompts(data)
        assert f.format == "prompt records"
        assert [(p.id, p.prompt, p.system, p.category) for p in f.prompts][0] == ("7", "One", "S", "x")
        assert f.prompts[1].prompt == "Two"


def test_sharegpt_conversations():
    f = read_prompts((ASSETS / "prompts" / "sharegpt.json").read_bytes())
    assert f.format == "sharegpt" and len(f.prompts) == 6
    multi = next(p for p in f.prompts if p.id == "sg-3")
    assert [m["role"] for m in multi.history] == ["user", "assistant"] and multi.prompt.startswith("Can you write")
    assert next(p for p in f.prompts if p.id == "sg-2").system == "You are a friendly travel guide."


def test_csv_with_a_prompt_column():
    f = read_prompts(b'id,Prompt,category\nq1,"Hello, there",greet\nq2,"Two\nlines",\n')
    assert f.format == "csv" and [(p.id, p.prompt, p.category) for p in f.prompts] == [
        ("q1", "Hello, there", "greet"), ("q2", "Two\nlines", None)]


def test_prompts_may_name_the_document_they_ask_about():
    records = [{"prompt": "Q1", "document": "report"}, {"prompt": "Q2", "document": 7}, {"prompt": "Q3", "document": ""},
               {"messages": [{"role": "user", "content": "Q4"}], "document": "report"}]
    assert [p.document for p in read_prompts(jsonl(*records)).prompts] == ["report", "7", None, "report"]
    csv = read_prompts(b"prompt,document\nQ1,report\nQ2,\n")
    assert [p.document for p in csv.prompts] == ["report", None]


def test_csv_with_semicolons_or_tabs():
    for sep in (";", "\t"):
        f = read_prompts(f"prompt{sep}category\nHello, there{sep}greet\n".encode())
        assert f.format == "csv" and [(p.prompt, p.category) for p in f.prompts] == [("Hello, there", "greet")]


def test_plain_text_prompts_separated_by_blank_lines():
    f = read_prompts("First prompt\nstill the first.\n\n\nSecond prompt\r\n \t\r\nThird\r\rFourth".encode())
    assert f.format == "text" and [p.prompt for p in f.prompts] == ["First prompt\nstill the first.", "Second prompt",
                                                                    "Third", "Fourth"]
    assert [p.prompt for p in read_prompts(b"[INST] Hi [/INST]\n\n{not a record}").prompts] == [
        "[INST] Hi [/INST]", "{not a record}"]
    assert [p.prompt for p in read_prompts("One\n\u00a0\f\nTwo\n\n\n".encode()).prompts] == ["One", "Two"]   # any blank


def test_a_text_whose_first_line_is_prompt_alone_is_text_and_one_column_of_csv_is_csv():
    text = read_prompts(b"Prompt\nWrite a limerick, about cats.\nKeep it clean.\n\nPrompt\nExplain quicksort.\n")
    assert text.format == "text" and [p.prompt for p in text.prompts] == [
        "Prompt\nWrite a limerick, about cats.\nKeep it clean.", "Prompt\nExplain quicksort."]
    for data in (b"prompt\nHello\nHow are you?\n", b'prompt\n"Two\n\nparagraphs"\nNext\n', b"prompt\nHello\n\n"):
        column = read_prompts(data)
        assert column.format == "csv" and column.prompts[0].prompt in ("Hello", "Two\n\nparagraphs")


def test_json_lines_keep_unicode_line_separators_and_a_pretty_printed_object_is_one_record():
    f = read_prompts(json.dumps({"prompt": "one\u2028two\u0085three"}, ensure_ascii=False).encode() + b"\n")
    assert f.prompts[0].prompt == "one\u2028two\u0085three"
    f = read_prompts(json.dumps({"messages": [{"role": "developer", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"}]}, indent=2).encode())
    assert (f.format, f.prompts[0].id, f.prompts[0].system) == ("messages", "record 1", "Be brief.")


def test_the_shipped_chat_sample_has_categories_and_long_documents():
    f = read_prompts((ASSETS / "prompts" / "chat.jsonl").read_bytes())
    assert f.format == "messages" and "long document" in f.categories and len(f.categories) >= 4
    assert max(p.chars for p in f.prompts) > 15_000 and any(p.history for p in f.prompts)
    long = [p for p in f.prompts if p.category == "long document"]   # questions about one text name it
    assert all(p.document for p in long) and len({p.document for p in long}) == 5 < len(long)
    assert not any(p.document for p in f.prompts if p.category != "long document")


def test_a_sample_is_seeded_and_keeps_file_order():
    data = "\n\n".join(f"prompt {i}" for i in range(50)).encode()
    a, b = (read_prompts(data, sample=10, seed=3) for _ in range(2))
    ids = [int(p.prompt.split()[1]) for p in a.prompts]
    assert a == b and len(ids) == 10 and ids == sorted(ids)
    assert read_prompts(data, sample=10, seed=4) != a and len(read_prompts(data, sample=99).prompts) == 50


@pytest.mark.parametrize("data, message", [
    (b"", "the file is empty"),
    (b"  \n\n ", "the file is empty"),
    (b'{"prompt": "ok"}\n{"prompt": "ok too"}\n{not json\n', "line 3: not JSON"),
    (b'[{"prompt": "a"}, {"text": "b"}]', 'record 2: no prompt (a record needs "prompt", "messages" or "conversations")'),
    (b'{"prompt": null}\n', "line 1: no prompt"),
    (b'{"prompt": "  "}\n', "line 1: prompt is empty"),
    (b'[1, 2]', "record 1: not a JSON object"),
    (b'[{"prompt": "a",}]', "not JSON: Expecting property name"),
    (b'{\n  "prompt": "a",\n  "id": \n}', "not JSON: Expecting value at line 4, column 1"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": null}]}]}\n', "line 1: turn 1 is empty"),
    (b'{"messages": [{"role": "assistant", "content": "x"}]}\n', "line 1: the conversation has no user turn"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}\n', "line 1: turn 1 has the unknown role 'robot'"),
    (b'{"conversations": [{"from": "human"}]}\n', "line 1: turn 1 has no 'from' and 'value'"),
    (b'{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', "the id '1' names two prompts"),
    (b"prompt,id\nfine,1\n,2\n", "row 3: prompt is empty"),
    (b"prompt\nok,extra\n", "row 2: more cells than the header has columns"),
    ("caf\xe9 au lait".encode("latin-1"), "the file is not UTF-8 text (byte 3"),
    (b'[{"prompt": "a"} {"prompt": "b"}]', "not JSON: Expecting ',' delimiter at line 1, column 18"),
    (b'[{"prompt": "a"},]', "not JSON: Expecting value at line 1, column 18"),
    (b'[{"prompt": "a"}] and more', "not JSON: Extra data at line 1, column 19"),
    (b'{"prompt": "a", "id": [1]}\n', "line 1: id is not text"),
    (b'{"prompt": "a", "document": {"name": "x"}}\n', "line 1: document is not text"),
    (b'{"prompt": "a", "id": 1' + b"0" * 5000 + b"}\n", "line 1: a number of more than 4,300 digits"),
    (jsonl({"messages": [{"role": "x" * 100_000, "content": "hi"}]}), "line 1: turn 1 has the unknown role 'xxx"),
    (b"prompt\nok\n" + b"x" * 5_000_000 + b"\n", "row 3: a cell holds more than 131,072 characters"),
])
def test_an_unreadable_file_is_one_line_naming_the_record(data, message):
    assert message in refused(data)[0]


def refused(data: bytes | str, limits: PromptLimits = PromptLimits(), sample: int | None = None) -> tuple[str, float]:
    """The message `data` is refused with, checked to be one short line, and the seconds the refusal took."""
    started = time.perf_counter()
    with pytest.raises(PromptFileError) as e:
        read_prompts(data, limits, sample)
    message = str(e.value)
    assert "\n" not in message and len(message) < 200, message
    return message, time.perf_counter() - started


def test_a_repeated_id_among_100000_records_is_found_at_once():
    records = [{"prompt": f"p{i}", "id": str(i)} for i in range(99_999)] + [{"prompt": "again", "id": "99998"}]
    message, seconds = refused(json.dumps(records).encode(), PromptLimits(max_prompts=100_000))
    assert message == "the id '99998' names two prompts" and seconds < 3   # old reader: minutes (ids.count per id)


@pytest.mark.parametrize("data, message", [
    (b"[" * 10_000 + b"]" * 10_000, "record 1: JSON nested too deeply"),
    (b'[{"prompt": "a"}, ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_000 + b"]", "record 2: JSON nested too deeply"),
    (b'{"prompt": "a"}\n{"prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}\n", "line 2: JSON nested too deeply"),
    (b'{\n  "prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"\n}", "record 1: JSON nested too deeply"),
])
def test_json_nested_10000_deep_is_one_message(data, message):
    said, seconds = refused(data)
    assert said == message and seconds < 2


def many(form: str, size: int) -> bytes:
    """About `size` bytes of the smallest prompts a file of `form` holds."""
    unit = {"text": b"x\n\n", "jsonl": b'{"prompt":"x"}\n', "json": b'{"prompt":"x"},', "csv": b"x\n"}[form]
    body = unit * (size // len(unit))
    return {"text": body, "jsonl": body, "json": b"[" + body[:-1] + b"]", "csv": b"prompt\n" + body}[form]


@pytest.mark.parametrize("form", ["text", "jsonl", "json", "csv"])
def test_a_19_MiB_file_of_tiny_prompts_is_refused_once_past_the_limit(form):
    """Reading stops one prompt past the limit: millions of prompts are never built."""
    data = many(form, 19 * 2**20)
    tracemalloc.start()
    try:
        message, seconds = refused(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the old reader took 20-40 s
    assert message.startswith("the file has more than 1,000 prompts; the limit is 1,000") and seconds < 5
    assert peak < 4 * len(data), f"{peak / 2**20:.0f} MiB to refuse a {len(data) / 2**20:.0f} MiB file"
    message, seconds = refused(data, sample=3)   # a sample is drawn from all of a file's prompts: a limit of its own
    assert "more than 100,000 prompts" in message and seconds < 5


def test_a_csv_with_a_header_of_millions_of_columns_costs_its_rows_alone():
    """Rows shorter than the header cost their own cells, not the header's (csv.DictReader's did)."""
    data = "prompt" + ",a" * 1_000_000 + "\n" + "x\n" * 100_000
    started = time.perf_counter()
    with pytest.raises(PromptFileError, match="the file has more than 1,000 prompts"):
        read_prompts(data, PromptLimits(max_file_bytes=50 * 2**20))
    with pytest.raises(PromptFileError, match="more than 100,000 prompts; the limit is 100,000 to draw a sample"):
        read_prompts(data + "y\n", PromptLimits(max_file_bytes=50 * 2**20), sample=3)
    assert time.perf_counter() - started < 3


def test_a_50_MB_paste_is_refused_by_its_size():
    message, seconds = refused("x" * 50_000_000)
    assert message == "the pasted text is 47.7 MiB; the limit is 20 MiB" and seconds < 1


def test_a_file_over_the_size_limit_is_not_read(tmp_path):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.truncate(8 * 2**30)   # sparse: reading it would take seconds and 8 GiB
    started = time.perf_counter()
    with pytest.raises(PromptFileError, match="^the file is 8 GiB; the limit is 20 MiB$"):
        read_prompt_file(path)
    assert time.perf_counter() - started < 1
    path.write_bytes(b"Hi\n\nThere")
    assert [p.prompt for p in read_prompt_file(path).prompts] == ["Hi", "There"]


def test_the_limits_are_settings_with_clear_messages():
    data = jsonl(*({"prompt": f"p{i}"} for i in range(5)), {"prompt": "x" * 300, "id": "long"})
    with pytest.raises(PromptFileError, match="the file has more than 5 prompts; the limit is 5"):
        read_prompts(data, PromptLimits(max_prompts=5))
    with pytest.raises(PromptFileError, match="long: the prompt is 300 characters; the limit is 200"):
        read_prompts(data, PromptLimits(max_prompt_chars=200))
    with pytest.raises(PromptFileError, match=f"the file is {len(data)} bytes; the limit is 10 bytes"):
        read_prompts(data, PromptLimits(max_file_bytes=10))
    assert len(read_prompts(data, PromptLimits(max_prompts=5), sample=5).prompts) == 5   # the limit is on what runs
    with pytest.raises(PromptFileError, match="the sample must be 1 to 5 prompts, got 6"):
        read_prompts(data, PromptLimits(max_prompts=5), sample=6)
    with pytest.raises(PromptFileError, match="the file has more than 4 prompts; the limit is 4 to draw a sample from"):
        read_prompts(data, PromptLimits(max_sampled_from=4), sample=2)
