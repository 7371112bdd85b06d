"""The launch's SFT data (planner/launch/data.py): plain text trains every token; TRL's
prompt-completion and conversational formats train only the completion and the assistants'
turns (the tokenizer's chat template renders the conversation), packed or padded."""

import pytest

from planner.core.errors import PlannerInputError
from planner.launch.data import Padded, example_tokens, packed_blocks, read_texts, samples

torch = pytest.importorskip("torch")

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture()
def tokenizer():
    from planner.launch.model_folder import tokenizer as make

    t = make(4096)
    t.chat_template = TEMPLATE
    return t


def _trained(ids, labels) -> list[int]:
    return [i for i, x in zip(ids, labels, strict=True) if x != -100]


def test_a_conversation_trains_only_its_assistants_turns(tokenizer):
    eos = [tokenizer.eos_token_id]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two plus two"},
                {"role": "assistant", "content": "four"}, {"role": "user", "content": "and three more"},
                {"role": "assistant", "content": "seven"}]
    ids, labels = example_tokens({"messages": messages, "line": 1}, tokenizer, eos)
    assert ids == list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
    turns = [list(tokenizer("four", add_special_tokens=False)["input_ids"]) + eos,
             list(tokenizer("seven", add_special_tokens=False)["input_ids"]) + eos]
    assert _trained(ids, labels) == turns[0] + turns[1]  # each turn's content and its end token, nothing else


def test_a_prompt_and_completion_trains_the_completion(tokenizer):
    eos = [tokenizer.eos_token_id]
    ids, labels = example_tokens({"prompt": "the capital of france is", "completion": " paris"}, tokenizer, eos)
    completion = list(tokenizer(" paris", add_special_tokens=False)["input_ids"]) + eos
    assert _trained(ids, labels) == completion and ids[-len(completion):] == completion
    text, labels = example_tokens("plain text", tokenizer, eos)
    assert labels == text


def test_formats_are_read_from_jsonl_and_batched_with_their_labels(tokenizer, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "a whole document"}\n{"prompt": "p", "completion": "c"}\n'
                    '{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}\n')
    examples = read_texts(str(data))
    assert examples[0] == "a whole document" and set(examples[1]) == {"prompt", "completion"}
    rows = samples(examples, tokenizer, 64)
    batch = Padded(0)(rows)
    for row, labels in zip(rows, batch["labels"], strict=True):
        assert labels[:len(row["labels"])].tolist() == row["labels"]  # the example's mask, then padding -100
        assert (labels[len(row["labels"]):] == -100).all()
    packed = packed_blocks(examples, tokenizer, 8, at_least=2, repeat=True)
    trained = sum(int((packed[i]["labels"] != -100).sum()) for i in range(len(packed)))
    assert 0 < trained < sum(packed[i]["input_ids"].numel() for i in range(len(packed)))


def test_bad_conversations_are_refused_with_the_line(tokenizer, tmp_path):
    data = tmp_path / "data.jsonl"
    for line, said in (('{"messages": [{"role": "user", "content": "u"}]}', "an assistant turn"),
                       ('{"messages": [{"role": "user"}]}', "string role and content"),
                       ('{"other": 1}', "no messages and no prompt and completion")):
        data.write_text(line + "\n")
        with pytest.raises(PlannerInputError, match=said):
            read_texts(str(data))
    tokenizer.chat_template = None
    with pytest.raises(PlannerInputError, match="chat template"):
        example_tokens({"messages": [{"role": "assistant", "content": "a"}], "line": 1}, tokenizer, [])
    # a template that drops earlier assistant turns once another follows (as reasoning templates do)
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                               "<|{{ m['role'] }}|>{{ m['content'] }}{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "v"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(PlannerInputError, match="line 7"):
        example_tokens({"messages": messages, "line": 7}, tokenizer, [])
