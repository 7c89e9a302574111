"""Deterministic toy tokenizer, chat template and output vocabulary of the simulator.

Input text splits into regex pieces (words of at most six letters, digits, single
symbols, whitespace runs); each piece maps to an id by CRC32 into the ordinary vocabulary.
The chat template adds two tokens per message (role marker, end of turn) and one for the
generation prompt, so ``/tokenize``, ``usage.prompt_tokens`` and ``prompt_token_ids`` agree.
Output ids come from the same vocabulary, each with a fixed text.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

VOCAB_SIZE = 1000
FIRST_ORDINARY = 16
UNK, BOS, EOS = 0, 1, 2
SYSTEM, USER, ASSISTANT, TOOL = 3, 4, 5, 6
TOOL_CALL_OPEN, TOOL_CALL_CLOSE, THINK_OPEN, THINK_CLOSE = 7, 8, 9, 10
ROLE_TOKENS = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT,
               "tool": TOOL, "function": TOOL}
SPECIAL_TEXT = {UNK: "<unk>", BOS: "<s>", EOS: "</s>", SYSTEM: "<|system|>", USER: "<|user|>",
                ASSISTANT: "<|assistant|>", TOOL: "<|tool|>", TOOL_CALL_OPEN: "<tool_call>",
                TOOL_CALL_CLOSE: "</tool_call>", THINK_OPEN: "<think>", THINK_CLOSE: "</think>"}

_PIECE = re.compile(r" ?[A-Za-z]{1,6}| ?\d| ?[^\sA-Za-z\d]|\s+")

_WORD_TEXT = (
    "the of and to in is that it for was on are as with be at this by from have or one had "
    "not but what all were when we there can an your which their said if do will each about "
    "how up out them then she many some so these would other into has more her two like him "
    "see time could no make than first been its who now people my made over did down only way "
    "find use may water long little very after words called just where most know get through "
    "back much before go good new write our used me man too any day same right look think "
    "also around another came come work three word must because does part even place well "
    "such here take why things help put years different away again off went old number great "
    "tell men say small every found still between name should home big give air line set own "
    "under read last never us left end along while might next sound below saw something "
    "thought both few those always show large often together asked house world going want "
    "school important until form food keep children feet land side without boy once life "
    "enough took four head above kind began almost live page got earth need far hand high year "
    "mother light country father let night picture being study second eyes soon times story "
    "since white ever paper hard near sentence better best across during today others however "
    "sure means knew try told young sun ways thing whole hear example heard several change "
    "answer room sea against top turned learn point city play toward five using himself "
    "usually router engine token stream batch prefill decode model request reply"
)
_WORDS = _WORD_TEXT.split()
_SUFFIXES = ("ing", "ed", "s", "er", "ly", "tion")
_SYMBOLS = (".", ",", "!", "?", ":", ";", "(", ")", "-", "\n", '"', "'", "\\", "/", "é", "ß",
            "日本", "語", "🙂", "—", "…", "ñ", " 42", " 7", "\t", "ü", "€")


def _build_vocab() -> list[str]:
    texts = [SPECIAL_TEXT.get(i, f"<|reserved_{i}|>") for i in range(FIRST_ORDINARY)]
    candidates: list[str] = list(_SYMBOLS)
    for word in _WORDS:
        candidates.append(" " + word)
    for word in _WORDS:
        candidates.append(word)
    for word in _WORDS:
        for suffix in _SUFFIXES:
            candidates.append(" " + word + suffix)
    seen: set[str] = set()
    for text in candidates:
        if text not in seen:
            seen.add(text)
            texts.append(text)
        if len(texts) == VOCAB_SIZE:
            break
    return texts


TEXTS: list[str] = _build_vocab()
assert len(TEXTS) == VOCAB_SIZE
# Special tokens decode to "" in generated text (vLLM skips special tokens).
OUTPUT_TEXTS: list[str] = ["" if i < FIRST_ORDINARY else t for i, t in enumerate(TEXTS)]
# JSON-escaped text without quotes; concatenating escapes equals escaping the concatenation.
ESCAPED: list[bytes] = [orjson.dumps(t)[1:-1] for t in OUTPUT_TEXTS]
ID_BYTES: list[bytes] = [str(i).encode() for i in range(VOCAB_SIZE)]


def piece_id(piece: str) -> int:
    """The id of one input piece."""
    span = VOCAB_SIZE - FIRST_ORDINARY
    return FIRST_ORDINARY + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % span


def pieces(text: str) -> list[str]:
    """Split text into tokenizer pieces."""
    return _PIECE.findall(text)


def encode(text: str) -> list[int]:
    """Token ids of plain text (no special tokens)."""
    return [piece_id(p) for p in _PIECE.findall(text)]


def encode_prompt(text: str, add_special_tokens: bool = True) -> list[int]:
    """Completion-style prompt: BOS, then the text's tokens."""
    ids = encode(text)
    return [BOS, *ids] if add_special_tokens else ids


def message_text(content: Any) -> str:
    """The text of a chat message ``content``: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    out.append(text)
            elif isinstance(part, str):
                out.append(part)
        return "".join(out)
    return str(content)


def _extra_text(message: dict[str, Any]) -> str:
    """Tool calls carried by an assistant message, rendered into its turn."""
    parts = []
    for key in ("tool_calls", "function_call"):
        value = message.get(key)
        if value:
            parts.append(orjson.dumps(value).decode())
    return "".join(parts)


def encode_chat(
    messages: Sequence[Any],
    tools: Iterable[Any] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Chat template: per message ``<role> content </s>``; tools as a system turn first."""
    ids: list[int] = []
    if tools:
        ids.append(SYSTEM)
        ids.extend(encode(orjson.dumps(list(tools)).decode()))
        ids.append(EOS)
    for message in messages:
        if not isinstance(message, dict):
            continue
        ids.append(ROLE_TOKENS.get(str(message.get("role")), USER))
        ids.extend(encode(message_text(message.get("content")) + _extra_text(message)))
        ids.append(EOS)
    if add_generation_prompt:
        ids.append(ASSISTANT)
    return ids
