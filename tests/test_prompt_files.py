"""Prompt files in every supported form, and every way one can be unreadable: one line naming the record."""

import json

import pytest

from playground.evaluation.prompt_files import PromptFileError, PromptLimits, read_prompts
from playground.evaluation.prompt_sets import ASSETS


def jsonl(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


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
    (b'{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n', "line 2: a messages record in a file of"),
    (b'{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', "the id '1' names two prompts"),
    (b"prompt,id\nfine,1\n,2\n", "row 3: prompt is empty"),
    (b"prompt\nok,extra\n", "row 2: more cells than the header has columns"),
    ("caf\xe9 au lait".encode("latin-1"), "the file is not UTF-8 text (byte 3"),
])
def test_an_unreadable_file_is_one_line_naming_the_record(data, message):
    with pytest.raises(PromptFileError) as e:
        read_prompts(data)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_limits_are_settings_with_clear_messages():
    data = jsonl(*({"prompt": f"p{i}"} for i in range(5)), {"prompt": "x" * 300, "id": "long"})
    with pytest.raises(PromptFileError, match="the file has 6 prompts; the limit is 5"):
        read_prompts(data, PromptLimits(max_prompts=5))
    with pytest.raises(PromptFileError, match="long: the prompt is 300 characters; the limit is 200"):
        read_prompts(data, PromptLimits(max_prompt_chars=200))
    with pytest.raises(PromptFileError, match=f"the file is {len(data)} bytes; the limit is 10 bytes"):
        read_prompts(data, PromptLimits(max_file_bytes=10))
    assert len(read_prompts(data, PromptLimits(max_prompts=5), sample=5).prompts) == 5   # the limit is on what runs
