//! Non-streaming assembly: engine events into one vLLM-0.32-shaped response body.
//!
//! Strings, lists and metadata are kept as the engine's JSON bytes: string fragments are
//! joined inside one pair of quotes (JSON escapes are self-contained, so this equals
//! decoding, joining and re-encoding, and keeps the engine's escapes and split surrogate
//! pairs intact) and list fragments are joined with commas.

use serde::Deserialize;

use crate::delta::{
    as_integer, as_u64, list_inner, string_inner, Choice, Event, Kind, Raw, UsageInfo,
};
use crate::error::StreamError;
use crate::session::Options;

mod body;
pub use body::usage_with_details;

/// One tool-call fragment of a chat delta, as sent.
#[derive(Deserialize)]
struct ToolWire<'a> {
    #[serde(borrow, default)]
    index: Option<Raw<'a>>,
    #[serde(borrow, default)]
    id: Option<Raw<'a>>,
    #[serde(borrow, default, rename = "type")]
    kind: Option<Raw<'a>>,
    #[serde(borrow, default)]
    function: Option<Raw<'a>>,
    #[serde(borrow, default)]
    custom: Option<Raw<'a>>,
}

/// `{name, arguments}` of a tool call's `function` or of a legacy `function_call`.
#[derive(Deserialize)]
struct FnWire<'a> {
    #[serde(borrow, default)]
    name: Option<Raw<'a>>,
    #[serde(borrow, default)]
    arguments: Option<Raw<'a>>,
}

#[derive(Deserialize)]
struct ChatLogprobsWire<'a> {
    #[serde(borrow, default)]
    content: Option<Raw<'a>>,
    #[serde(borrow, default)]
    refusal: Option<Raw<'a>>,
}

#[derive(Deserialize)]
struct CompletionLogprobsWire<'a> {
    #[serde(borrow, default)]
    text_offset: Option<Raw<'a>>,
    #[serde(borrow, default)]
    token_logprobs: Option<Raw<'a>>,
    #[serde(borrow, default)]
    tokens: Option<Raw<'a>>,
    #[serde(borrow, default)]
    top_logprobs: Option<Raw<'a>>,
}

/// A checked tool-call fragment.
struct ToolFrag<'a> {
    index: u64,
    id: Option<Raw<'a>>,
    kind: Option<Raw<'a>>,
    name: Option<Raw<'a>>,
    arguments: Option<Raw<'a>>,
    custom: bool,
}

/// The checked parts of one choice that assembly concatenates.
struct Parts<'a> {
    index: u64,
    tools: Vec<ToolFrag<'a>>,
    function_call: Option<(Option<Raw<'a>>, Option<Raw<'a>>)>,
    /// Logprob arrays (chat: content, refusal; completion: text_offset, token_logprobs,
    /// tokens, top_logprobs); `None` when `logprobs` is null.
    logprobs: Option<[Option<Raw<'a>>; 4]>,
    stop_reason: Option<Raw<'a>>,
}

/// Checked preparation of one event: its choices' parts, in event order.
pub struct Prepared<'a>(Vec<Parts<'a>>);

#[derive(Debug, Default)]
struct ToolAcc {
    index: u64,
    id: Option<Vec<u8>>,
    name: Option<Vec<u8>>,
    arguments: Option<Vec<u8>>,
}

/// Joined bytes of one field, `None` until a fragment arrives.
type Bytes = Option<Vec<u8>>;

#[derive(Debug, Default)]
struct ChoiceAcc {
    index: u64,
    /// The role chunk's role, as sent (JSON string).
    role: Option<Vec<u8>>,
    content: Option<Vec<u8>>,
    reasoning: Option<Vec<u8>>,
    reasoning_content: Option<Vec<u8>>,
    refusal: Option<Vec<u8>>,
    text: Option<Vec<u8>>,
    function_call: Option<(Bytes, Bytes)>,
    tools: Vec<ToolAcc>,
    logprobs: Option<[Bytes; 4]>,
    finish_reason: Option<Vec<u8>>,
    stop_reason: Option<Vec<u8>>,
    token_ids: Option<Vec<u8>>,
    prompt_token_ids: Option<Vec<u8>>,
}

/// Accumulates a stream's events into the final non-streaming body.
#[derive(Debug)]
pub struct Assembler {
    chat: bool,
    expose_token_ids: bool,
    /// `include_reasoning: false` (chat): no reasoning, `token_ids` or `logprobs`.
    strip_reasoning: bool,
    /// `echo: true` (chat): vLLM's message content is never null.
    echo: bool,
    id: Option<Vec<u8>>,
    created: Option<Vec<u8>>,
    model: Option<Vec<u8>>,
    system_fingerprint: Option<Vec<u8>>,
    usage: Option<Vec<u8>>,
    prompt_token_ids: Option<Vec<u8>>,
    choices: Vec<ChoiceAcc>,
}

fn want<'a>(r: Option<Raw<'a>>, kind: Kind, what: &str) -> Result<Option<Raw<'a>>, StreamError> {
    match r {
        Some(v) if Kind::of(v) != kind => Err(StreamError::malformed(format!(
            "{what} must be {}, got {}",
            kind.noun(),
            Kind::of(v).noun()
        ))),
        _ => Ok(r),
    }
}

fn want_some<'a>(r: Raw<'a>, kind: Kind, what: &str) -> Result<Raw<'a>, StreamError> {
    want(Some(r), kind, what).map(|_| r)
}

fn index_of(r: Option<Raw<'_>>, what: &str) -> Result<u64, StreamError> {
    r.and_then(as_u64).ok_or_else(|| {
        StreamError::malformed(format!(
            "{what} must be a nonnegative integer, got {}",
            r.map_or("nothing", |v| v.get())
        ))
    })
}

fn parse_wire<'a, T: Deserialize<'a>>(r: Raw<'a>, what: &str) -> Result<T, StreamError> {
    serde_json::from_str(r.get())
        .map_err(|e| StreamError::malformed(format!("{what} is not valid: {e}")))
}

fn push_str(acc: &mut Option<Vec<u8>>, r: Option<Raw<'_>>) {
    if let Some(r) = r {
        acc.get_or_insert_with(Vec::new)
            .extend_from_slice(string_inner(r));
    }
}

fn push_list(acc: &mut Option<Vec<u8>>, inner: &[u8]) {
    let v = acc.get_or_insert_with(Vec::new);
    if !inner.is_empty() {
        if !v.is_empty() {
            v.push(b',');
        }
        v.extend_from_slice(inner);
    }
}

fn first(slot: &mut Option<Vec<u8>>, r: Option<Raw<'_>>) {
    if slot.is_none() {
        if let Some(r) = r {
            *slot = Some(r.get().as_bytes().to_vec());
        }
    }
}

fn last(slot: &mut Option<Vec<u8>>, r: Option<Raw<'_>>) {
    if let Some(r) = r {
        *slot = Some(r.get().as_bytes().to_vec());
    }
}

fn tool_frags<'a>(raw: Raw<'a>) -> Result<Vec<ToolFrag<'a>>, StreamError> {
    let elements: Vec<Raw<'a>> = parse_wire(raw, "delta.tool_calls")?;
    let mut frags = Vec::with_capacity(elements.len());
    for e in elements {
        let w: ToolWire<'a> =
            parse_wire(want_some(e, Kind::Object, "tool_calls[]")?, "tool_calls[]")?;
        let index = index_of(w.index, "tool_calls[].index")?;
        let id = want(w.id, Kind::String, "tool_calls[].id")?;
        let kind = want(w.kind, Kind::String, "tool_calls[].type")?;
        let (mut name, mut arguments) = (None, None);
        if let Some(f) = want(w.function, Kind::Object, "tool_calls[].function")? {
            let f: FnWire<'a> = parse_wire(f, "tool_calls[].function")?;
            name = want(f.name, Kind::String, "tool_calls[].function.name")?;
            arguments = want(f.arguments, Kind::String, "tool_calls[].function.arguments")?;
        }
        frags.push(ToolFrag {
            index,
            id,
            kind,
            name,
            arguments,
            custom: w.custom.is_some(),
        });
    }
    Ok(frags)
}

impl Assembler {
    /// An empty assembler for a chat (`chat`) or completion stream; `opts` says what the
    /// client asked (token IDs, reasoning, echo).
    pub fn new(chat: bool, opts: &Options) -> Self {
        Assembler {
            chat,
            expose_token_ids: opts.expose_token_ids,
            strip_reasoning: chat && opts.strip_reasoning,
            echo: chat && opts.echo,
            id: None,
            created: None,
            model: None,
            system_fingerprint: None,
            usage: None,
            prompt_token_ids: None,
            choices: Vec::new(),
        }
    }

    fn parts<'a>(&self, c: &Choice<'a>) -> Result<Parts<'a>, StreamError> {
        let index = index_of(c.index, "choices[].index")?;
        let mut tools = Vec::new();
        let mut function_call = None;
        if let Some(d) = &c.delta {
            if let Some(tc) = d.tool_calls {
                tools = tool_frags(tc)?;
            }
            if let Some(f) = d.function_call {
                let f: FnWire<'a> = parse_wire(f, "delta.function_call")?;
                function_call = Some((
                    want(f.name, Kind::String, "delta.function_call.name")?,
                    want(f.arguments, Kind::String, "delta.function_call.arguments")?,
                ));
            }
        }
        let logprobs = match want(c.logprobs, Kind::Object, "logprobs")? {
            None => None,
            Some(lp) if self.chat => {
                let w: ChatLogprobsWire<'a> = parse_wire(lp, "logprobs")?;
                Some([
                    want(w.content, Kind::List, "logprobs.content")?,
                    want(w.refusal, Kind::List, "logprobs.refusal")?,
                    None,
                    None,
                ])
            }
            Some(lp) => {
                let w: CompletionLogprobsWire<'a> = parse_wire(lp, "logprobs")?;
                Some([
                    want(w.text_offset, Kind::List, "logprobs.text_offset")?,
                    want(w.token_logprobs, Kind::List, "logprobs.token_logprobs")?,
                    want(w.tokens, Kind::List, "logprobs.tokens")?,
                    want(w.top_logprobs, Kind::List, "logprobs.top_logprobs")?,
                ])
            }
        };
        let mut stop_reason = None;
        for (r, what) in [
            (c.stop_reason, "stop_reason"),
            (c.matched_stop, "matched_stop"),
        ] {
            if let Some(v) = r {
                if Kind::of(v) != Kind::String && as_integer(v).is_none() {
                    return Err(StreamError::malformed(format!(
                        "{what} must be a string or an integer, got {}",
                        v.get()
                    )));
                }
                stop_reason = stop_reason.or(Some(v));
            }
        }
        Ok(Parts {
            index,
            tools,
            function_call,
            logprobs,
            stop_reason,
        })
    }

    /// Check everything this event contributes: malformed fields first (for the whole
    /// event), then fields assembly cannot represent.
    pub fn prepare<'a>(&self, ev: &Event<'a>) -> Result<Prepared<'a>, StreamError> {
        let choices = ev.choices.as_deref().unwrap_or(&[]);
        let parts = choices
            .iter()
            .map(|c| self.parts(c))
            .collect::<Result<Vec<_>, _>>()?;
        for (c, p) in choices.iter().zip(&parts) {
            if let Some(k) = &c.unknown {
                return Err(StreamError::unsupported(format!(
                    "unsupported choice field `{k}`"
                )));
            }
            if let Some(k) = c.delta.as_ref().and_then(|d| d.unknown.as_ref()) {
                return Err(StreamError::unsupported(format!(
                    "unsupported delta field `{k}`"
                )));
            }
            for t in &p.tools {
                if t.custom {
                    return Err(StreamError::unsupported(
                        "custom tool output is not supported",
                    ));
                }
                if let Some(k) = t.kind.filter(|k| k.get() != "\"function\"") {
                    return Err(StreamError::unsupported(format!(
                        "tool call type {} is not supported",
                        k.get()
                    )));
                }
            }
        }
        Ok(Prepared(parts))
    }

    fn choice(&mut self, index: u64) -> &mut ChoiceAcc {
        let pos = match self.choices.iter().position(|c| c.index == index) {
            Some(p) => p,
            None => {
                self.choices.push(ChoiceAcc {
                    index,
                    ..ChoiceAcc::default()
                });
                self.choices.len() - 1
            }
        };
        &mut self.choices[pos]
    }

    /// The body's `model` is `model` (a JSON value) whatever the events say.
    pub fn set_model(&mut self, model: Vec<u8>) {
        self.model = Some(model);
    }

    /// Fold a prepared event in. `usage` is the event's parsed usage, if any.
    pub fn apply(&mut self, ev: &Event<'_>, prepared: Prepared<'_>, usage: Option<&UsageInfo>) {
        first(&mut self.id, ev.id);
        first(&mut self.created, ev.created);
        first(&mut self.model, ev.model);
        last(&mut self.system_fingerprint, ev.system_fingerprint);
        if let (Some(raw), Some(info)) = (ev.usage, usage) {
            self.usage = Some(usage_with_details(raw.get().as_bytes(), info));
        }
        first(&mut self.prompt_token_ids, ev.prompt_token_ids);
        let chat = self.chat;
        for (c, p) in ev.choices.iter().flatten().zip(prepared.0) {
            if chat && self.prompt_token_ids.is_none() {
                first(&mut self.prompt_token_ids, c.prompt_token_ids);
            }
            let strip = self.strip_reasoning;
            let acc = self.choice(p.index);
            if let Some(d) = &c.delta {
                first(&mut acc.role, d.role);
                push_str(&mut acc.content, d.content);
                if !strip {
                    push_str(&mut acc.reasoning, d.reasoning);
                    push_str(&mut acc.reasoning_content, d.reasoning_content);
                }
                push_str(&mut acc.refusal, d.refusal);
            }
            push_str(&mut acc.text, c.text);
            if let Some((name, args)) = p.function_call {
                let fc = acc.function_call.get_or_insert((None, None));
                push_str(&mut fc.0, name);
                push_str(&mut fc.1, args);
            }
            for t in p.tools {
                let pos = match acc.tools.iter().position(|a| a.index == t.index) {
                    Some(p) => p,
                    None => {
                        acc.tools.push(ToolAcc {
                            index: t.index,
                            ..ToolAcc::default()
                        });
                        acc.tools.len() - 1
                    }
                };
                let tool = &mut acc.tools[pos];
                push_str(&mut tool.id, t.id);
                push_str(&mut tool.name, t.name);
                push_str(&mut tool.arguments, t.arguments);
            }
            if let Some(arrays) = p.logprobs.filter(|_| !strip) {
                let lp = acc.logprobs.get_or_insert_with(Default::default);
                for (slot, r) in lp.iter_mut().zip(arrays) {
                    if let Some(r) = r {
                        push_list(slot, list_inner(r));
                    }
                }
            }
            last(&mut acc.finish_reason, c.finish_reason);
            last(&mut acc.stop_reason, p.stop_reason);
            if let Some(ids) = c.token_ids.filter(|_| !strip) {
                push_list(&mut acc.token_ids, list_inner(ids));
            }
            if !chat {
                first(&mut acc.prompt_token_ids, c.prompt_token_ids);
            }
        }
    }
}
