"""Training data for the planner launch: the user's text, tokenised and batched as the plan says
(planner/core/lengths.py): packed into sequences of the plan's length (every token trains; no
padding), or one document per sequence, truncated to the plan's length and padded to the
micro-batch's longest (or to the plan's length), the padding masked out of attention and loss.

Local only: a JSONL file, a ``.txt`` file (one document per blank-line-separated paragraph), or a
folder written by ``datasets``' ``save_to_disk`` (the text in ``text_field``). A JSONL line holds
the text in ``text_field`` (every token trains), or TRL's conversational ``messages`` (role and
content; rendered with the tokenizer's chat template, and only the assistants' turns train), or a
``prompt`` and a ``completion`` (only the completion trains).
``sample``: a small text shipped with planner, repeated as needed: for smoke tests of a launch,
never for training.

A DPO plan trains on preference pairs: JSONL objects with ``prompt``, ``chosen`` and ``rejected``
fields, all strings or all lists of messages (TRL's standard and conversational preference
formats: TRL renders the latter with the chat template), or ``sample``: pairs cut from the sample
text, each sequence longer than the plan's length (so TRL truncates every row to it, the plan's
worst case).

A KTO plan trains on unpaired completions: JSONL objects with ``prompt`` and ``completion`` (both
strings or both lists of messages: TRL's unpaired preference formats) and a boolean ``label``
(desirable or not), in the file's order (KTOConfig samples sequentially: its KL estimate pairs each
completion with the next row's prompt), or ``sample``: rows cut from the sample text, each longer
than the plan's length, labels alternating.

A GRPO plan trains on prompts: JSONL objects with a ``prompt`` (TRL's prompt-only format; the
other fields go to the reward function), a string cut to the plan's prompt length (its rows less
the completion) or a list of messages (rendered by TRL with the chat template; refused where it
renders longer), or ``sample``: prompts cut from the sample text at that length (the worst case).
"""

import json
from pathlib import Path

from planner.core.errors import PlannerInputError

SAMPLE = "sample"
SAMPLE_FILE = Path(__file__).with_name("sample.txt")


def read_texts(source: str, text_field: str = "text") -> list:
    """The examples of ``source`` (see the module docstring): texts, or conversations and
    prompt-completion pairs (dicts) from JSONL."""
    path = SAMPLE_FILE if source == SAMPLE else Path(source)
    if path.is_dir():
        return _saved_dataset(path, text_field)
    if not path.is_file():
        raise PlannerInputError(f"--data {source}: no such file or folder",
                                hint="Pass a JSONL file, a .txt file, a datasets folder, or 'sample' for a smoke test.")
    text = _read(path, source)
    if path.suffix in (".jsonl", ".json"):
        return _jsonl(text, source, text_field)
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _read(path: Path, source: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PlannerInputError(f"--data {source}: cannot read it: {e}") from None


def _json_lines(text: str, source: str):
    """(line number, parsed value) of every non-blank line of a JSONL text."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise PlannerInputError(f"--data {source}: line {n} is not JSON: {e}") from None


def _jsonl(text: str, source: str, field: str) -> list:
    """Each line's example: its text (a string), or its ``messages`` or ``prompt`` and
    ``completion`` (a dict, tokenised by ``example_tokens``)."""
    out: list = []
    for n, row in _json_lines(text, source):
        if isinstance(row, dict) and isinstance(row.get(field), str):
            out.append(row[field])
        elif isinstance(row, dict) and isinstance(row.get("messages"), list):
            bad = [m for m in row["messages"] if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                                                      and isinstance(m.get("content"), str))]
            if bad or not any(m["role"] == "assistant" for m in row["messages"]):
                raise PlannerInputError(f"--data {source}: line {n}: messages need string role and content, and an "
                                        "assistant turn to train on")
            out.append({"messages": row["messages"], "line": n})
        elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            out.append({"prompt": row["prompt"], "completion": row["completion"]})
        else:
            raise PlannerInputError(f"--data {source}: line {n} has no string field {field!r}, no messages and no "
                                    "prompt and completion",
                                    hint="Name the text field with --text-field, or use TRL's conversational "
                                         "(messages) or prompt-completion format.")
    return out


def example_tokens(example, tokenizer, eos: list[int]) -> tuple[list[int], list[int]]:
    """An example's token ids and labels (-100 where no loss): a text trains every token and its
    end-of-sequence token; a prompt and completion only the completion and that token; a
    conversation only its assistants' turns, each the tokens its chat template adds for the turn
    after the generation prompt (the prefix up to the turn, rendered alone, must begin the whole
    conversation's: true of templates that do not rewrite earlier turns)."""
    if isinstance(example, str):
        ids = tokenizer(example, add_special_tokens=False)["input_ids"] + eos
        return ids, ids
    if "prompt" in example:
        prompt = tokenizer(example["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(example["completion"], add_special_tokens=False)["input_ids"] + eos
        return prompt + completion, [-100] * len(prompt) + completion
    if tokenizer.chat_template is None:
        raise PlannerInputError("--data: conversational messages need the model's chat template, and its tokenizer "
                                "has none", hint="Use a model folder whose tokenizer has a chat template, or "
                                                 "prompt and completion fields.")
    messages = example["messages"]

    def render(upto: int, prompt: bool) -> list[int]:
        return list(tokenizer.apply_chat_template(messages[:upto], tokenize=True, add_generation_prompt=prompt,
                                                  return_dict=False))

    ids = render(len(messages), False)
    labels = [-100] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = render(i, True), render(i + 1, False)
        if ids[:len(end)] != end or end[:len(start)] != start:
            raise PlannerInputError(f"--data: line {example['line']}: the chat template renders the turns before an "
                                    "assistant's differently once it follows, so its tokens cannot be told apart",
                                    hint="Use prompt and completion fields for this data.")
        labels[len(start):len(end)] = ids[len(start):len(end)]
    return ids, labels


def _saved_dataset(path: Path, field: str) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise PlannerInputError(f"--data {path}: a datasets folder needs the datasets package (pip install datasets)") from None
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        data = data["train"] if "train" in data else next(iter(data.values()))
    if field not in data.column_names:
        raise PlannerInputError(f"--data {path}: no column {field!r} (columns: {', '.join(data.column_names)})",
                                hint="Name the text column with --text-field.")
    return list(data[field])


def packed_blocks(texts: list[str], tokenizer, seq_len: int, at_least: int = 0, repeat: bool = False):
    """Token blocks of ``seq_len``: the documents tokenised, each followed by the end-of-sequence
    token, concatenated and cut (the last partial block is dropped). ``repeat``: cycle the text
    until there are ``at_least`` blocks (the smoke-test sample). A torch Dataset of
    {"input_ids", "labels"} (the model shifts the labels)."""
    import torch

    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    targets: list[int] = []
    for text in texts:
        ids, labels = example_tokens(text, tokenizer, eos)
        stream += ids
        targets += labels
    if not stream:
        raise PlannerInputError("the training data has no text")
    if repeat and len(stream) < at_least * seq_len:
        times = -(-at_least * seq_len // len(stream))
        stream, targets = stream * times, targets * times
    n = len(stream) // seq_len
    if n < max(1, at_least):
        raise PlannerInputError(f"the training data has {len(stream):,} tokens: {n} sequence(s) of {seq_len:,}, "
                                f"fewer than one optimizer step needs ({max(1, at_least)})")
    blocks = torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)
    labels = torch.tensor(targets[: n * seq_len], dtype=torch.long).view(n, seq_len)
    return _Blocks(blocks, labels)


class _Blocks:
    """Packed sequences as a map-style dataset."""

    def __init__(self, blocks, labels):
        self.blocks, self.labels = blocks, labels

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.labels[i]}


def samples(texts: list[str], tokenizer, seq_len: int, at_least: int = 0, repeat: bool = False):
    """One sequence per document: tokenised, followed by the end-of-sequence token, truncated to
    ``seq_len``. ``repeat``: cycle the documents until there are ``at_least`` (the smoke-test
    sample). A map-style dataset of {"input_ids"} lists (``Padded`` pads each micro-batch)."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    rows = [{"input_ids": ids[:seq_len], "labels": labels[:seq_len]}
            for ids, labels in (example_tokens(t, tokenizer, eos) for t in texts) if ids]
    if not rows:
        raise PlannerInputError("the training data has no text")
    if repeat and len(rows) < at_least:
        rows = rows * -(-at_least // len(rows))
    if len(rows) < max(1, at_least):
        raise PlannerInputError(f"the training data has {len(rows):,} document(s), fewer than one optimizer step "
                                f"needs ({max(1, at_least)})")
    return rows


class Padded:
    """The collator of padded batching: each micro-batch's rows padded to its longest (or to
    ``length``, padded-max), up to a ``multiple`` of tokens (a sequence split over ranks:
    strategies/sequence_parallel.py ``pad_multiple``), with an attention mask, and the padding's
    labels -100 (no loss)."""

    def __init__(self, pad_id: int, length: int | None = None, multiple: int = 1):
        self.pad_id, self.length, self.multiple = pad_id, length, multiple

    def __call__(self, features: list[dict]) -> dict:
        import torch

        rows = [list(f["input_ids"]) for f in features]
        width = self.length or -(-max(len(r) for r in rows) // self.multiple) * self.multiple
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (r, f) in enumerate(zip(rows, features, strict=True)):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            labels[i, :len(r)] = torch.tensor(list(f.get("labels", r)), dtype=torch.long)
            mask[i, :len(r)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class WithPositions:
    """``collator``'s batches with position ids ``0 .. n-1`` in every row: the positions the model
    counts when it is given none (a packed block is one sequence; a padded row's padding, at its
    end, has no loss). Under Ulysses every rank needs them: it holds a slice of each row and its
    attention gathers the global positions, and DeepSpeed's ``UlyssesSPDataLoaderAdapter`` refuses
    a batch without them."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features: list[dict]) -> dict:
        import torch

        batch = self.collator(features)
        rows, width = batch["input_ids"].shape
        return batch | {"position_ids": torch.arange(width).expand(rows, width).clone()}


PAIR_FIELDS = ("prompt", "chosen", "rejected")
UNPAIRED_FIELDS = ("prompt", "completion")


def _messages(value) -> bool:
    """Whether ``value`` is a conversation in TRL's format: role and content strings."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def _records(source: str, fields: tuple[str, ...], what: str, holds: str) -> list[dict]:
    """The JSONL objects of ``source``, each with a string, or a conversation (TRL's
    conversational format, which TRL's trainers render with the chat template), in every one of
    ``fields``; ``what`` the file must be, ``holds`` what its lines hold (for the messages)."""
    path = Path(source)
    if path.suffix not in (".jsonl", ".json") or not path.is_file():
        raise PlannerInputError(f"--data {source}: {what}",
                                hint=f"Pass a JSONL file whose lines hold {holds}, or 'sample' for a smoke test.")
    rows = []
    for n, row in _json_lines(_read(path, source), source):
        if not isinstance(row, dict) or not all(isinstance(row.get(f), str) or _messages(row.get(f)) for f in fields):
            raise PlannerInputError(f"--data {source}: line {n} needs fields {', '.join(fields)}, each a string or "
                                    "a list of messages (role and content)")
        rows.append(row | {"line": n})
    return rows


def preference_pairs(source: str, seq_len: int, at_least: int) -> list[dict]:
    """The preference pairs of ``source`` (the module docstring; all three fields strings, or all
    three conversations, TRL's conversational preference format), at least ``at_least`` of them
    for ``sample`` (repeated: a smoke test)."""
    if source != SAMPLE:
        rows = _records(source, PAIR_FIELDS, "a DPO plan trains on a JSONL file of preference pairs",
                        "prompt, chosen and rejected strings (or lists of messages)")
        for row in rows:
            if len({isinstance(row[f], str) for f in PAIR_FIELDS}) > 1:
                raise PlannerInputError(f"--data {source}: line {row['line']}: prompt, chosen and rejected are all "
                                        "strings or all lists of messages (TRL's two preference formats)")
        return [{f: row[f] for f in PAIR_FIELDS} for row in rows]
    text = " ".join(read_texts(SAMPLE))
    span = max(8 * seq_len, 64)  # characters: several per token, so every row exceeds seq_len tokens
    pairs: list[dict[str, str]] = []
    while len(pairs) < max(at_least, 1):
        i = (len(pairs) * 97) % max(len(text) - 3 * span, 1)
        pairs.append({"prompt": text[i:i + 64], "chosen": text[i + 64:i + 64 + span],
                      "rejected": text[i + 64 + span:i + 64 + 2 * span]})
    return pairs


def unpaired_completions(source: str, seq_len: int, at_least: int) -> list[dict]:
    """The unpaired completions of ``source`` (the module docstring), at least ``at_least`` of them
    for ``sample`` (repeated: a smoke test)."""
    if source != SAMPLE:
        rows = _records(source, UNPAIRED_FIELDS, "a KTO plan trains on a JSONL file of unpaired completions",
                        "prompt and completion strings (or lists of messages) and a boolean label")
        for row in rows:
            if not isinstance(row.get("label"), bool):
                raise PlannerInputError(f"--data {source}: line {row['line']}: label must be true or false (a "
                                        "desirable completion or not)")
            if len({isinstance(row[f], str) for f in UNPAIRED_FIELDS}) > 1:
                raise PlannerInputError(f"--data {source}: line {row['line']}: prompt and completion are both strings "
                                        "or both lists of messages (TRL's two unpaired preference formats)")
        return [{f: row[f] for f in (*UNPAIRED_FIELDS, "label")} for row in rows]
    text = " ".join(read_texts(SAMPLE))
    span = max(8 * seq_len, 64)  # characters: several per token, so every row exceeds seq_len tokens
    rows_: list[dict] = []
    while len(rows_) < max(at_least, 1):
        i = (len(rows_) * 97) % max(len(text) - 2 * span, 1)
        rows_.append({"prompt": text[i:i + 64], "completion": text[i + 64:i + 64 + span],
                      "label": len(rows_) % 2 == 0})
    return rows_


def grpo_prompts(source: str, tokenizer, prompt_tokens: int, at_least: int) -> list[dict]:
    """The prompts of ``source`` (the module docstring), each cut to ``prompt_tokens`` tokens less
    two (a prompt decoded and tokenised again by TRL may take a token more); at least ``at_least``
    of them for ``sample`` (repeated: a smoke test)."""
    keep = max(prompt_tokens - 2, 1)

    def cut(row: dict) -> dict:
        """A string prompt cut to length; a conversation (rendered by TRL with the chat template,
        and not cut) refused where it renders longer."""
        line, text = row.pop("line", None), row["prompt"]
        if not isinstance(text, str):
            ids = tokenizer.apply_chat_template(text, tokenize=True, add_generation_prompt=True, return_dict=False)
            if len(ids) > prompt_tokens:
                raise PlannerInputError(f"--data: line {line}: the prompt's messages render to {len(ids):,} tokens, "
                                        f"more than the plan's prompt ({prompt_tokens:,}: its rows less the completion)",
                                        hint="Shorten the conversation, or plan a longer --seq-len.")
            return row
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return row if len(ids) <= keep else row | {"prompt": tokenizer.decode(ids[:keep])}

    if source != SAMPLE:
        return [cut(row) for row in _records(source, ("prompt",), "a GRPO plan trains on a JSONL file of prompts",
                                             "a prompt")]
    text = " ".join(read_texts(SAMPLE))
    span = max(8 * prompt_tokens, 64)  # characters: several per token, so every prompt is cut to length
    rows: list[dict] = []
    while len(rows) < max(at_least, 1):
        i = (len(rows) * 97) % max(len(text) - span, 1)
        rows.append(cut({"prompt": text[i:i + span]}))
    return rows

