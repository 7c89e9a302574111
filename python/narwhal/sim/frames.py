"""Streaming SSE events in vLLM 0.32's exact bytes, from per-request pre-serialised templates.

Per request the constant parts (id, created, model, option-dependent tails) are built once;
per event only the delta, the ID list and optional logprobs/usage are spliced in. Field
order and null placement follow the 0.32 captures in ``reference/transcripts``.

The simulated engine runs with reasoning and tool parsers on: with ``include_reasoning:
false`` reasoning leaves the stream and every ``token_ids`` and ``logprobs`` is null. Echo:
chat sends the last message's text in its own chunk after the role chunk; completions put
the prompt text (``""`` with ``return_token_ids``) before the first generated text, with the
prompt's IDs and logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from narwhal.sim import faults, logprobs, tokenizer
from narwhal.sim import segments as sg

_REASONING = frozenset({sg.REASONING.kind, sg.REASONING_CONTENT.kind})

DONE = b"data: [DONE]\n\n"


@dataclass
class StreamOptions:
    """What the client asked for that shapes each event."""

    return_ids: bool = False
    include_usage: bool = False
    continuous: bool = False
    logprobs: int | None = None  # chat: top_logprobs when logprobs is true; completions: k
    id_fault: str | None = None
    id_fault_after: int = 0
    hide_reasoning: bool = False  # chat include_reasoning false: no reasoning, IDs, logprobs
    role: str = "assistant"  # chat: the response role (the last message's without a prompt)
    echo_only: bool = False  # completions echo with max_tokens 0: the prompt, not the token


class Choice:
    """The emission state of one choice that frames read (kept by the stream module)."""

    __slots__ = ("cached_tokens", "echo", "first_sent", "index", "prompt_ids", "prompt_tokens",
                 "sent", "text_offset")

    def __init__(self, index: int, prompt_ids: list[int], echo: str | None = None) -> None:
        self.index = index
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.cached_tokens = 0  # prompt tokens the engine's prefix cache held
        self.echo = echo  # the echoed text (None: no echo asked)
        self.sent = 0  # tokens already rendered into events
        self.first_sent = False
        self.text_offset = 0


class _Frames:
    def __init__(self, rid: str, obj: bytes, created: int, model_json: bytes,
                 fingerprint: str, opts: StreamOptions) -> None:
        self.opts = opts
        self.top = b'data: {"id":"' + rid.encode() + b'","object":"' + obj + \
            b'","created":%d,"model":' % created + model_json + b',"choices":'
        self.fp = b',"system_fingerprint":"' + fingerprint.encode() + b'"'
        # The fingerprint rides on the finish event unless a usage frame follows.
        self.finish_fp = b"" if opts.include_usage else self.fp
        self.continuous = opts.include_usage and opts.continuous

    def ids_field(self, ids: list[int], produced: int) -> bytes:
        opts = self.opts
        if opts.id_fault is not None and produced > opts.id_fault_after:
            return faults.ids_field(opts.id_fault, ids)
        if not opts.return_ids:
            return b',"token_ids":null'
        return b',"token_ids":' + sg.render_ids(ids)

    def usage_obj(self, prompt: int, completion: int) -> bytes:
        return b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
            prompt, prompt + completion, completion)

    def usage_frame(self, prompt: int, completion: int, cached: int = 0) -> bytes:
        """The final usage-only frame (no nulls), carrying the fingerprint; ``cached``: the
        prompt_tokens_details.cached_tokens to report (0: none, as vLLM)."""
        usage = self.usage_obj(prompt, completion)
        if cached:
            usage = usage[:-1] + b',"prompt_tokens_details":{"cached_tokens":%d}}' % cached
        return self.top + b'[],"usage":' + usage + self.fp + b"}\n\n"


class ChatFrames(_Frames):
    """``chat.completion.chunk`` events of one single-choice request."""

    def __init__(self, rid: str, created: int, model_json: bytes, fingerprint: str,
                 opts: StreamOptions, empty_delta: bytes) -> None:
        super().__init__(rid, b"chat.completion.chunk", created, model_json, fingerprint, opts)
        self.head = self.top + b'[{"index":0,"delta":'
        self.empty = empty_delta
        self.hide = opts.hide_reasoning
        # vLLM sends events for tokens without text only to carry IDs or logprobs.
        self.quiet = self.hide or (
            not opts.return_ids and opts.logprobs is None and opts.id_fault is None)
        # Fast path for the common event: one text token, no logprobs/usage/fault.
        self.fast = (opts.logprobs is None and not self.continuous and opts.id_fault is None
                     and not self.hide)
        self.fast_ids = b',"logprobs":null,"finish_reason":null,"token_ids":' + (
            b"[" if opts.return_ids else b"null")
        self.fast_end = b"]}]}\n\n" if opts.return_ids else b"}]}\n\n"

    def _cont(self, prompt: int, completion: int) -> bytes:
        if not self.continuous:
            return b""
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,' \
            b'"completion_tokens_details":null}' % (prompt, prompt + completion, completion)

    def role(self, choice: Choice) -> bytes:
        ids = sg.render_ids(choice.prompt_ids) if self.opts.return_ids else b"null"
        return (self.head + b'{"role":' + orjson.dumps(self.opts.role) + b',"content":""},'
                b'"logprobs":null,"finish_reason":null}]' + self._cont(choice.prompt_tokens, 0)
                + b',"prompt_token_ids":' + ids + b',"prompt_text":null}\n\n')

    def echo(self, choice: Choice, text: str) -> bytes:
        """The echo chunk: the last message's text; no IDs, no prompt fields."""
        return (self.head + b'{"content":' + orjson.dumps(text) + b'},"logprobs":null,'
                b'"finish_reason":null}]' + self._cont(choice.prompt_tokens, 0) + b"}\n\n")

    def ids_field(self, ids: list[int], produced: int) -> bytes:
        if self.hide and self.opts.id_fault is None:
            return b',"token_ids":null'
        return super().ids_field(ids, produced)

    def events(self, choice: Choice, toks: list[sg.Tok], finish: str | None) -> list[bytes]:
        """Events for the tokens produced since the last call; ``finish`` marks the last."""
        if self.fast and finish is None and len(toks) == 1 and choice.first_sent:
            text_seg, tid, esc, _ = toks[0]
            if text_seg.mergeable and text_seg is not sg.NONE:
                choice.sent += 1
                ids = tokenizer.ID_BYTES[tid] if self.opts.return_ids else b""
                return [b"".join((self.head, text_seg.open, esc, text_seg.close, self.fast_ids,
                                  ids, self.fast_end))]
        out: list[bytes] = []
        if not choice.first_sent:
            choice.first_sent = True
            out.append(self.role(choice))
            if choice.echo:
                out.append(self.echo(choice, choice.echo))
        groups: list[tuple[sg.Seg | None, list[sg.Tok]]]
        if len(toks) == 1 and finish is None:
            only = toks[0][0]
            groups = [(None if only is sg.NONE else only, toks)]
        else:
            groups = sg.group(toks)
        last = len(groups) - 1
        count = choice.sent
        for n, (seg, run) in enumerate(groups):
            count += len(run)
            fin = finish if n == last else None
            hidden = self.hide and seg is not None and seg.kind in _REASONING
            if (seg is None or hidden) and fin is None and self.quiet:
                continue  # vLLM sends ID-only events only when IDs or logprobs were asked
            if hidden:
                delta = sg.EMPTY_DELTA  # the parser hid the reasoning: an empty finish delta
            else:  # tokens without text: vLLM's empty DeltaMessage, or the finish delta
                delta = sg.delta_of(seg, run, self.empty if fin is not None else sg.EMPTY_DELTA)
            k = self.opts.logprobs
            lp = b"null" if k is None or self.hide else logprobs.chat(run, k)
            ids = self.ids_field([t[1] for t in run], count)
            cont = self._cont(choice.prompt_tokens, count)
            if fin is None:
                out.append(self.head + delta + b',"logprobs":' + lp + b',"finish_reason":null'
                           + ids + b"}]" + cont + b"}\n\n")
            else:
                out.append(self.head + delta + b',"logprobs":' + lp + b',"finish_reason":"'
                           + fin.encode() + b'","stop_reason":null' + ids + b"}]" + cont
                           + self.finish_fp + b"}\n\n")
        choice.sent = count
        return out


class CompletionFrames(_Frames):
    """``text_completion`` events; one request may carry several choices (prompts)."""

    def __init__(self, rid: str, created: int, model_json: bytes, fingerprint: str,
                 opts: StreamOptions) -> None:
        super().__init__(rid, b"text_completion", created, model_json, fingerprint, opts)
        self.head = self.top + b'[{"index":'

    def events(self, choice: Choice, toks: list[sg.Tok], finish: str | None) -> list[bytes]:
        count = choice.sent + len(toks)
        k = self.opts.logprobs
        echo = choice.echo if not choice.first_sent else None
        if echo is not None:
            # The prompt's text (or "") before the first generated text; logprobs cover the
            # prompt's tokens too (the first one unscored); vLLM sends the prompt IDs
            # whether or not they were asked.
            shown = [] if self.opts.echo_only else toks
            text = orjson.dumps(echo)[1:-1] + b"".join(t[2] for t in shown)
            lp = b"null"
            if k is not None:
                scored = logprobs.prompt_toks(choice.prompt_ids) + shown
                lp = logprobs.completion(scored, k, 0, len(choice.prompt_ids))[0]
            choice.text_offset = len(echo) + sum(len(t[3]) for t in shown)
            prompt_ids = sg.render_ids(choice.prompt_ids)
        else:
            text = toks[0][2] if len(toks) == 1 else b"".join(t[2] for t in toks)
            if k is None:
                lp = b"null"
            else:
                lp, choice.text_offset = logprobs.completion(toks, k, choice.text_offset)
            if not choice.first_sent and self.opts.return_ids:
                prompt_ids = sg.render_ids(choice.prompt_ids)
            else:
                prompt_ids = b"null"
        choice.first_sent = True
        fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
        cont = b""
        if self.continuous:
            cont = b',"usage":' + self.usage_obj(choice.prompt_tokens, count)
        ids = self.ids_field([t[1] for t in toks], count)
        choice.sent = count
        return [self.head + b"%d" % choice.index + b',"text":"' + text + b'","logprobs":' + lp
                + b',"finish_reason":' + fin + b',"stop_reason":null,"prompt_token_ids":'
                + prompt_ids + ids + b"}]" + cont + (self.finish_fp if finish else b"")
                + b"}\n\n"]


Frames = ChatFrames | CompletionFrames
