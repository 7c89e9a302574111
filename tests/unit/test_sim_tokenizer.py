"""The simulator's toy tokenizer and chat template: deterministic and self-consistent."""

from __future__ import annotations

from narwhal.sim import tokenizer as tk


def test_deterministic_pieces_in_vocab() -> None:
    text = "Hello, wonderful world 123 日本語 🙂\n\tend"
    ids = tk.encode(text)
    assert ids == tk.encode(text)
    assert len(ids) == len(tk.pieces(text))
    assert "".join(tk.pieces(text)) == text  # the pieces cover the whole text
    assert all(tk.FIRST_ORDINARY <= i < tk.VOCAB_SIZE for i in ids)


def test_chat_template_adds_two_per_message_and_one_for_the_reply() -> None:
    a = {"role": "system", "content": "be brief"}
    b = {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text",
                                                                      "text": "there"}]}
    ids = tk.encode_chat([a, b])
    body = len(tk.encode("be brief")) + len(tk.encode("hi there"))
    assert len(ids) == body + 2 * 2 + 1
    assert ids[0] == tk.SYSTEM and ids[-1] == tk.ASSISTANT and ids.count(tk.EOS) == 2
    assert len(tk.encode_chat([a, b], add_generation_prompt=False)) == len(ids) - 1
    assert len(tk.encode_chat([a], tools=[{"type": "function"}])) > len(tk.encode_chat([a]))


def test_completion_prompt_has_bos_and_output_vocabulary_is_fixed() -> None:
    assert tk.encode_prompt("def hello")[0] == tk.BOS
    assert tk.encode_prompt("def hello", add_special_tokens=False) == tk.encode("def hello")
    assert len(tk.TEXTS) == tk.VOCAB_SIZE == len(set(tk.TEXTS))
    assert tk.OUTPUT_TEXTS[tk.EOS] == "" and tk.ESCAPED[tk.FIRST_ORDINARY + 9] == b"\\n"
