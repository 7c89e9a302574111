//! One engine attempt's stream: framing, parsing, ID validation, exposure or assembly per read.

use std::str::FromStr;

use crate::assemble::Assembler;
use crate::chunked::{frame_chunk, ChunkError, ChunkedDecoder};
use crate::delta::{error_message, parse_event, parse_usage, Delta, Event, UsageInfo};
use crate::error::StreamError;
use crate::expose::{
    edits, is_emptied_by_strip, is_id_only, model_edit, write_event, Edit, Rewrite, DONE,
};
use crate::sse::SseFramer;
use crate::token_ids;

#[path = "resume.rs"]
mod resume;
use resume::Resume;

/// Which OpenAI route the stream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
}

impl FromStr for Route {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chat" => Ok(Route::Chat),
            "completion" => Ok(Route::Completion),
            other => Err(format!(
                "route must be \"chat\" or \"completion\", got {other:?}"
            )),
        }
    }
}

/// Where the stream stands after a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Open = 0,
    /// `[DONE]` arrived.
    Done = 1,
    /// The stream failed; see `failure()`.
    Failed = 2,
}

/// How a session treats its stream.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub route: Route,
    /// Build one non-streaming body instead of forwarding events.
    pub assemble: bool,
    /// The client asked for `return_token_ids`.
    pub expose_token_ids: bool,
    /// Drop usage-only frames (Narwhal asked for usage the client did not).
    pub drop_usage: bool,
    /// The engine returns IDs: every event carrying output must carry them.
    pub require_token_ids: bool,
    /// Sized prompt length, for usage computed when the engine sends none.
    pub prompt_tokens: u64,
    /// Chat only: the client sent `include_reasoning: false` and the engine was asked with
    /// reasoning. As vLLM does with its parsers on: reasoning leaves every delta (events
    /// left with nothing are dropped), and `token_ids` and `logprobs` are null everywhere.
    /// IDs are still validated and counted.
    pub strip_reasoning: bool,
    /// The client sent `echo: true`. Chat: vLLM's echo chunk (the last message's text right
    /// after the role chunk, without IDs) is prompt: accepted without IDs, not counted.
    /// Completions: the echo chunk's `prompt_token_ids` (sent by vLLM even when not asked)
    /// stay.
    pub echo: bool,
}

/// Bits of [`Pumped::flags`]: what a pumped read needs from the caller beyond the write.
pub mod pump_flags {
    /// The body's last chunk (and trailers) arrived: the connection may be reused.
    pub const BODY_ENDED: u32 = 1;
    /// The chunked framing is malformed (`framing_error` says how): a protocol error.
    pub const MALFORMED: u32 = 2;
    /// Tokens arrived while `watch_tokens` was set (it is then cleared).
    pub const TOKENS: u32 = 4;
    /// The state left `Open` in this read: nothing was written, `last_read` holds the read.
    pub const STATE: u32 = 8;
    /// Set by the binding: the writer failed (the client is gone); nothing more is written.
    pub const WRITE_FAILED: u32 = 16;
}

/// What one [`StreamSession::pump`] produced.
#[derive(Debug)]
pub struct Pumped<'a> {
    /// The client's chunk (chunked framing included); empty when nothing is to be written.
    pub write: &'a [u8],
    /// The read's tokens (as `feed` counts them) when written here; 0 with `STATE`.
    pub tokens: u64,
    /// [`pump_flags`] bits.
    pub flags: u32,
}

/// One engine attempt. Feed it every network read; it returns what to write to the client.
#[derive(Debug)]
pub struct StreamSession {
    framer: SseFramer,
    core: Core,
    /// `pump` only: the engine body's chunked framing.
    decoder: ChunkedDecoder,
    /// `pump` only: the output framed as one chunk of the client's body.
    framed: Vec<u8>,
    framing_error: Option<ChunkError>,
    /// `pump` reports `TOKENS` for the next read with tokens.
    pub watch_tokens: bool,
}

/// Everything but the framer, so the framer's callback can borrow it.
#[derive(Debug)]
struct Core {
    opts: Options,
    state: State,
    failure: Option<StreamError>,
    engine_error: Option<Vec<u8>>,
    engine_error_message: Option<String>,
    ids_total: u64,
    output_events: u64,
    usage_completion_tokens: Option<u64>,
    /// The prompt's length as the engine counted it: its `prompt_token_ids` (the first
    /// list seen) or its usage's `prompt_tokens` (which wins: it covers every prompt).
    engine_prompt_tokens: Option<u64>,
    /// Its usage's `prompt_tokens_details.cached_tokens` (the engine's prefix-cache hit).
    engine_cached_tokens: Option<u64>,
    events: u64,
    read_count: u64,
    out: Vec<u8>,
    edits: Vec<Edit>,
    /// What exposure rewrites (fixed by the options).
    rewrite: Rewrite,
    /// `strip_reasoning` on the chat route.
    strip: bool,
    /// A chat echo chunk may still come (no generated output yet).
    echo_open: bool,
    /// With `drop_usage`: the last finish event, written out, held back for the
    /// `system_fingerprint` of the usage frame being dropped (vLLM stamps it on the finish
    /// event when the client asked no usage). Goes out with the next output.
    held: Vec<u8>,
    /// With a model rename: the name the client sent, as a JSON string, for the top-level
    /// `model` of every event and of the assembled body.
    model: Option<Box<[u8]>>,
    assembler: Option<Assembler>,
    /// With `enable_resume`: what a continuation on another engine needs.
    resume: Option<Box<Resume>>,
}

impl StreamSession {
    /// A session at the start of the engine's response body.
    pub fn new(opts: Options) -> Self {
        let chat = opts.route == Route::Chat;
        let strip = chat && opts.strip_reasoning;
        let assembler = opts.assemble.then(|| Assembler::new(chat, &opts));
        let rewrite = Rewrite {
            token_ids: true,
            prompt_token_ids: !opts.expose_token_ids,
            choice_prompt_token_ids: !opts.expose_token_ids && (chat || !opts.echo),
            strip_reasoning: strip,
        };
        StreamSession {
            framer: SseFramer::new(),
            decoder: ChunkedDecoder::new(),
            framed: Vec::new(),
            framing_error: None,
            watch_tokens: false,
            core: Core {
                opts,
                state: State::Open,
                failure: None,
                engine_error: None,
                engine_error_message: None,
                ids_total: 0,
                output_events: 0,
                usage_completion_tokens: None,
                engine_prompt_tokens: None,
                engine_cached_tokens: None,
                events: 0,
                read_count: 0,
                out: Vec::with_capacity(1024),
                edits: Vec::new(),
                rewrite,
                strip,
                echo_open: chat && opts.echo,
                held: Vec::new(),
                model: None,
                assembler,
                resume: None,
            },
        }
    }

    /// Answer with `name` as the model: the top-level `model` of every event (where it
    /// says anything else) and of the assembled body becomes it, so the client sees the name
    /// it sent (an alias) while the engine was sent another. Call before the first feed.
    pub fn rename_model(&mut self, name: &str) {
        let json: Box<[u8]> = serde_json::to_vec(name)
            .unwrap_or_default()
            .into_boxed_slice();
        if let Some(asm) = &mut self.core.assembler {
            asm.set_model(json.to_vec());
        }
        self.core.model = Some(json);
    }

    /// Keep what resuming the answer on another engine needs (the prompt's and the generated
    /// IDs, the first event's identity), and stop at an engine error event while the answer
    /// can still be resumed (it is then not written; `engine_error` holds it). Call before
    /// the first feed, on a session whose engine returns token IDs.
    pub fn enable_resume(&mut self) {
        self.core.resume = Some(Box::new(Resume::new()));
    }

    /// Where the answer can be resumed: the continuation's token-ID prompt (a JSON list: the
    /// prompt's IDs, then the generated ones) and the number of generated IDs. None when it
    /// cannot: not enabled, finished, failed on the engine's output (only a break or a
    /// held-back error event can go on), or the output so far is more than plain generated
    /// text.
    pub fn resume_point(&self) -> Option<(Vec<u8>, u64)> {
        let c = &self.core;
        let r = c.resume.as_ref()?;
        let bad_output = c
            .failure
            .as_ref()
            .is_some_and(|f| !matches!(f, StreamError::Engine(_)));
        if c.state == State::Done || bad_output || !r.ready() {
            return None;
        }
        Some((r.prompt_json()?, c.ids_total))
    }

    /// Start reading the continuation engine's completion stream (from its first byte): its
    /// events come out in this stream's shape and count with the answer so far. False (and
    /// nothing changes) when the answer cannot be resumed.
    pub fn resume(&mut self) -> bool {
        if self.resume_point().is_none() {
            return false;
        }
        let c = &mut self.core;
        self.framer = SseFramer::new();
        c.state = State::Open;
        c.failure = None;
        c.engine_error = None;
        c.engine_error_message = None;
        if let Some(r) = &mut c.resume {
            r.begin(c.ids_total);
        }
        true
    }

    /// One network read: returns (bytes for the client, the read's validated token IDs —
    /// or, without required IDs, its events carrying output — and the state).
    pub fn feed(&mut self, data: &[u8]) -> (&[u8], u64, State) {
        let core = &mut self.core;
        core.out.clear();
        core.read_count = 0;
        if core.state == State::Open {
            let r = self.framer.feed(data, &mut |payload: &[u8], lines| {
                core.on_event(payload, lines)
            });
            if let Err(e) = r {
                core.fail(e);
            }
        }
        (&core.out, core.read_count, core.state)
    }

    /// Start pumping an engine body at a chunk boundary (the start of the body, or a point
    /// where another decoder left it at the end of a chunk).
    pub fn start_pump(&mut self) {
        self.decoder = ChunkedDecoder::new();
        self.framing_error = None;
    }

    /// One network read of the engine's chunked body, raw: de-chunked and fed as by `feed`;
    /// while the state stays `Open`, the output comes back framed as one chunk of the
    /// client's chunked body. When the state changes, nothing is to be written and
    /// `last_read` holds what `feed` would have returned.
    pub fn pump(&mut self, data: &[u8]) -> Pumped<'_> {
        let StreamSession {
            framer,
            core,
            decoder,
            framed,
            framing_error,
            watch_tokens,
        } = self;
        core.out.clear();
        core.read_count = 0;
        framed.clear();
        let before = core.state;
        let decoded = decoder.feed(data, &mut |piece: &[u8]| {
            if core.state == State::Open {
                let r = framer.feed(piece, &mut |payload: &[u8], lines| {
                    core.on_event(payload, lines)
                });
                if let Err(e) = r {
                    core.fail(e);
                }
            }
        });
        let mut flags = 0;
        if decoder.is_done() {
            flags |= pump_flags::BODY_ENDED;
        }
        if let Err(e) = decoded {
            flags |= pump_flags::MALFORMED;
            *framing_error = Some(e);
        }
        if core.state != before {
            return Pumped {
                write: &[],
                tokens: 0,
                flags: flags | pump_flags::STATE,
            };
        }
        let tokens = core.read_count;
        if tokens > 0 && *watch_tokens {
            *watch_tokens = false;
            flags |= pump_flags::TOKENS;
        }
        frame_chunk(framed, &core.out);
        Pumped {
            write: framed,
            tokens,
            flags,
        }
    }

    /// The last read as `feed` returns it (output unframed, tokens, state).
    pub fn last_read(&self) -> (&[u8], u64, State) {
        (&self.core.out, self.core.read_count, self.core.state)
    }

    /// Why `pump` found the chunked framing malformed, if it did.
    pub fn framing_error(&self) -> Option<&ChunkError> {
        self.framing_error.as_ref()
    }

    pub fn state(&self) -> State {
        self.core.state
    }

    /// Why the stream failed, once it has.
    pub fn failure(&self) -> Option<&StreamError> {
        self.core.failure.as_ref()
    }

    /// The raw JSON of the first engine error event, if any.
    pub fn engine_error(&self) -> Option<&[u8]> {
        self.core.engine_error.as_deref()
    }

    /// Events accepted (not counting `[DONE]`).
    pub fn events(&self) -> u64 {
        self.core.events
    }

    /// `completion_tokens` of the last engine usage object, if any.
    pub fn engine_usage_completion_tokens(&self) -> Option<u64> {
        self.core.usage_completion_tokens
    }

    /// The prompt's length as the engine counted it (`prompt_token_ids` or usage), if it
    /// said; feeds the sizing estimate's calibration.
    pub fn engine_prompt_tokens(&self) -> Option<u64> {
        self.core.engine_prompt_tokens
    }

    /// The prompt tokens the engine found in its prefix cache, when its usage said
    /// (`prompt_tokens_details.cached_tokens`); feeds the router's prefix index.
    pub fn engine_cached_tokens(&self) -> Option<u64> {
        self.core.engine_cached_tokens
    }

    /// Output length: the engine's usage when it sent one, else validated IDs (or events
    /// carrying output when IDs are not required).
    pub fn output_tokens(&self) -> u64 {
        self.core.output_tokens()
    }

    /// Assemble mode: the final body. Fails on an engine error event, on a failed or
    /// unfinished stream, and on a tool call without id or name.
    pub fn finish(&self) -> Result<Vec<u8>, StreamError> {
        let c = &self.core;
        let asm = c.assembler.as_ref().ok_or(StreamError::NotAssembling)?;
        if let Some(m) = &c.engine_error_message {
            return Err(StreamError::Engine(m.clone()));
        }
        if let Some(f) = &c.failure {
            return Err(f.clone());
        }
        if c.state != State::Done {
            return Err(StreamError::malformed("engine stream ended before [DONE]"));
        }
        asm.body(c.opts.prompt_tokens, c.output_tokens())
    }
}

impl Core {
    fn output_tokens(&self) -> u64 {
        self.usage_completion_tokens
            .unwrap_or(if self.opts.require_token_ids {
                self.ids_total
            } else {
                self.output_events
            })
    }

    fn fail(&mut self, e: StreamError) {
        self.release_held();
        self.state = State::Failed;
        self.failure = Some(e);
    }

    fn release_held(&mut self) {
        if !self.held.is_empty() {
            self.out.append(&mut self.held);
        }
    }

    /// The dropped usage frame's fingerprint goes where vLLM puts it without usage: last in
    /// the finish event.
    fn stamp_held(&mut self, fingerprint: &[u8]) {
        if let Some(end) = self.held.iter().rposition(|&c| c == b'}') {
            let mut tail = self.held.split_off(end);
            self.held.extend_from_slice(b",\"system_fingerprint\":");
            self.held.extend_from_slice(fingerprint);
            self.held.append(&mut tail);
        }
        self.release_held();
    }

    /// One complete event; false stops framing (done or failed).
    fn on_event(&mut self, payload: &[u8], lines: u32) -> bool {
        if payload == b"[DONE]" {
            self.state = State::Done;
            if !self.opts.assemble {
                self.release_held();
                self.out.extend_from_slice(DONE);
            }
            return false;
        }
        let done = if self.resume.as_ref().is_some_and(|r| r.continuing) {
            self.process_continued(payload, lines)
        } else {
            self.process(payload, lines)
        };
        match done {
            Ok(()) => true,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    /// A continuation engine's event, rewritten into this stream's shape first.
    fn process_continued(&mut self, payload: &[u8], lines: u32) -> Result<(), StreamError> {
        let ev = parse_event(payload)?;
        if ev.is_error() {
            return self.process(payload, lines);
        }
        let chat = self.opts.route == Route::Chat;
        let Some(r) = self.resume.as_mut() else {
            return self.process(payload, lines);
        };
        let mut scratch = std::mem::take(&mut r.scratch);
        let done = r
            .rewrite(&ev, chat, &mut scratch)
            .and_then(|()| self.process(&scratch, 1));
        if let Some(r) = self.resume.as_mut() {
            r.scratch = scratch;
        }
        done
    }

    fn process(&mut self, payload: &[u8], lines: u32) -> Result<(), StreamError> {
        let ev = parse_event(payload)?;
        if ev.is_error() {
            if self.engine_error.is_none() {
                self.engine_error = Some(payload.to_vec());
                self.engine_error_message = Some(error_message(&ev));
            }
            if self.resume.as_ref().is_some_and(|r| r.ready()) {
                // Held back: the answer may go on on another engine.
                return Err(StreamError::Engine(error_message(&ev)));
            }
            if !self.opts.assemble {
                self.release_held();
                write_event(&mut self.out, payload, &[], lines, b"");
            }
            self.events += 1;
            return Ok(());
        }
        let (ids, carrying, prompt) = self.check_ids(&ev)?;
        let usage = ev.usage.map(parse_usage).transpose()?;
        if let Some(r) = &mut self.resume {
            r.observe(&ev);
        }
        match &mut self.assembler {
            Some(asm) => {
                let prepared = asm.prepare(&ev)?;
                asm.apply(&ev, prepared, usage.as_ref());
            }
            None => self.expose(payload, &ev, lines),
        }
        self.commit(ids, carrying, prompt, usage);
        Ok(())
    }

    /// Validate every ID list of the event; returns (IDs, event carries generated output,
    /// length of the first prompt ID list).
    fn check_ids(&mut self, ev: &Event<'_>) -> Result<(u64, bool, Option<u64>), StreamError> {
        let mut prompt = None;
        if let Some(r) = ev.prompt_token_ids {
            let list = token_ids::validate(r, "prompt_token_ids")?;
            prompt = Some(list.count);
            if let Some(res) = &mut self.resume {
                res.note_prompt(list);
            }
        }
        let mut ids = 0;
        let mut carrying = false;
        for c in ev.choices.iter().flatten() {
            let echo = self.echo_open
                && c.token_ids.is_none()
                && c.finish_reason.is_none()
                && c.delta.as_ref().is_some_and(Delta::is_content_only);
            let out = !echo && c.carries_output();
            carrying |= out;
            match c.token_ids {
                Some(r) => {
                    let list = token_ids::validate(r, "token_ids")?;
                    ids += list.count;
                    if let Some(res) = &mut self.resume {
                        res.note_ids(list);
                    }
                }
                None if out && self.opts.require_token_ids => {
                    return Err(StreamError::malformed(
                        "an event carrying generated output has no token_ids (missing or null)",
                    ))
                }
                None => {}
            }
            if let Some(r) = c.prompt_token_ids {
                let list = token_ids::validate(r, "prompt_token_ids")?;
                prompt.get_or_insert(list.count);
                if let Some(res) = &mut self.resume {
                    res.note_prompt(list);
                }
            }
        }
        self.echo_open &= !carrying;
        Ok((ids, carrying, prompt))
    }

    fn expose(&mut self, payload: &[u8], ev: &Event<'_>, lines: u32) {
        if self.opts.drop_usage {
            if ev.is_usage_only() {
                match ev.system_fingerprint {
                    Some(fp) => self.stamp_held(fp.get().as_bytes()),
                    None => self.release_held(),
                }
                return;
            }
            self.release_held();
        }
        if self.hidden(ev) {
            return;
        }
        let start = self.out.len();
        let model = self.model.as_deref().unwrap_or_default();
        let rename = self
            .model
            .as_deref()
            .and_then(|m| model_edit(payload, ev, m));
        let as_sent = !self.strip && self.opts.expose_token_ids;
        if as_sent && rename.is_none() {
            write_event(&mut self.out, payload, &[], lines, model);
        } else {
            if as_sent {
                self.edits.clear();
            } else {
                edits(payload, ev, self.rewrite, &mut self.edits);
            }
            if let Some(edit) = rename {
                self.edits.push(edit);
                self.edits.sort_unstable();
            }
            write_event(&mut self.out, payload, &self.edits, lines, model);
        }
        if self.opts.drop_usage && ev.system_fingerprint.is_none() && finishes(ev) {
            self.held.extend_from_slice(&self.out[start..]);
            self.out.truncate(start);
        }
    }

    /// An event the client would not have had: left empty by stripping the reasoning, or
    /// (IDs not asked) there only to carry IDs.
    fn hidden(&self, ev: &Event<'_>) -> bool {
        if self.strip {
            is_emptied_by_strip(ev)
        } else {
            !self.opts.expose_token_ids && self.opts.route == Route::Chat && is_id_only(ev)
        }
    }

    fn commit(&mut self, ids: u64, carrying: bool, prompt: Option<u64>, usage: Option<UsageInfo>) {
        self.events += 1;
        if let Some(n) = prompt {
            self.engine_prompt_tokens.get_or_insert(n);
        }
        self.ids_total += ids;
        self.output_events += u64::from(carrying);
        self.read_count += if self.opts.require_token_ids {
            ids
        } else {
            u64::from(carrying)
        };
        if let Some(u) = usage {
            if let Some(n) = u.completion_tokens {
                self.usage_completion_tokens = Some(n);
            }
            if let Some(n) = u.prompt_tokens {
                self.engine_prompt_tokens = Some(n);
            }
            if let Some(n) = u.cached_tokens {
                self.engine_cached_tokens = Some(n);
            }
        }
    }
}

/// Some choice of the event has a finish reason.
fn finishes(ev: &Event<'_>) -> bool {
    ev.choices
        .iter()
        .flatten()
        .any(|c| c.finish_reason.is_some())
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
