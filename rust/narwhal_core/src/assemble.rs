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
    let wires: Vec<ToolWire<'a>> = parse_wire(raw, "delta.tool_calls")?;
    let mut frags = Vec::with_capacity(wires.len());
    for w in wires {
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
    /// An empty assembler for a chat (`chat`) or completion stream.
    pub fn new(chat: bool, expose_token_ids: bool) -> Self {
        Assembler {
            chat,
            expose_token_ids,
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
            let acc = self.choice(p.index);
            if let Some(d) = &c.delta {
                push_str(&mut acc.content, d.content);
                push_str(&mut acc.reasoning, d.reasoning);
                push_str(&mut acc.reasoning_content, d.reasoning_content);
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
            if let Some(arrays) = p.logprobs {
                let lp = acc.logprobs.get_or_insert_with(Default::default);
                for (slot, r) in lp.iter_mut().zip(arrays) {
                    if let Some(r) = r {
                        push_list(slot, list_inner(r));
                    }
                }
            }
            last(&mut acc.finish_reason, c.finish_reason);
            last(&mut acc.stop_reason, p.stop_reason);
            if let Some(ids) = c.token_ids {
                push_list(&mut acc.token_ids, list_inner(ids));
            }
            if !chat {
                first(&mut acc.prompt_token_ids, c.prompt_token_ids);
            }
        }
    }

    /// Every tool call ends with an id and a function name.
    pub fn check_complete(&self) -> Result<(), StreamError> {
        for c in &self.choices {
            for t in &c.tools {
                if t.id.as_ref().is_none_or(Vec::is_empty) {
                    return Err(StreamError::malformed(format!(
                        "tool call {} of choice {} has no id",
                        t.index, c.index
                    )));
                }
                if t.name.as_ref().is_none_or(Vec::is_empty) {
                    return Err(StreamError::malformed(format!(
                        "tool call {} of choice {} has no function name",
                        t.index, c.index
                    )));
                }
            }
        }
        Ok(())
    }

    /// The final body. `prompt_tokens` and `output_tokens` compute usage when the engine
    /// sent none.
    pub fn body(&self, prompt_tokens: u64, output_tokens: u64) -> Result<Vec<u8>, StreamError> {
        self.check_complete()?;
        let mut order: Vec<&ChoiceAcc> = self.choices.iter().collect();
        order.sort_by_key(|c| c.index);
        let mut o = Vec::with_capacity(512);
        o.extend_from_slice(b"{\"id\":");
        raw_or_null(&mut o, self.id.as_deref());
        o.extend_from_slice(if self.chat {
            b",\"object\":\"chat.completion\",\"created\":"
        } else {
            b",\"object\":\"text_completion\",\"created\":"
        });
        raw_or_null(&mut o, self.created.as_deref());
        o.extend_from_slice(b",\"model\":");
        raw_or_null(&mut o, self.model.as_deref());
        o.extend_from_slice(b",\"choices\":[");
        for (i, c) in order.iter().enumerate() {
            if i > 0 {
                o.push(b',');
            }
            if self.chat {
                self.chat_choice(&mut o, c);
            } else {
                self.completion_choice(&mut o, c);
            }
        }
        o.extend_from_slice(b"],\"service_tier\":null,\"system_fingerprint\":");
        raw_or_null(&mut o, self.system_fingerprint.as_deref());
        o.extend_from_slice(b",\"usage\":");
        match &self.usage {
            Some(u) => o.extend_from_slice(u),
            None => {
                let total = prompt_tokens.saturating_add(output_tokens);
                o.extend_from_slice(
                    format!(
                        "{{\"prompt_tokens\":{prompt_tokens},\"total_tokens\":{total},\
                         \"completion_tokens\":{output_tokens},\"prompt_tokens_details\":null,\
                         \"completion_tokens_details\":null}}"
                    )
                    .as_bytes(),
                );
            }
        }
        if self.chat {
            o.extend_from_slice(b",\"prompt_logprobs\":null,\"prompt_token_ids\":");
            self.ids(&mut o, self.prompt_token_ids.as_deref());
            o.extend_from_slice(b",\"prompt_text\":null");
        }
        o.extend_from_slice(
            b",\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}",
        );
        Ok(o)
    }

    fn ids(&self, o: &mut Vec<u8>, raw_list: Option<&[u8]>) {
        raw_or_null(o, raw_list.filter(|_| self.expose_token_ids));
    }

    fn chat_choice(&self, o: &mut Vec<u8>, c: &ChoiceAcc) {
        o.extend_from_slice(
            format!(
                "{{\"index\":{},\"message\":{{\"role\":\"assistant\",\"content\":",
                c.index
            )
            .as_bytes(),
        );
        let content = c
            .content
            .as_deref()
            .filter(|s| c.tools.is_empty() || !s.is_empty());
        string_or_null(o, content);
        o.extend_from_slice(b",\"refusal\":");
        string_or_null(o, c.refusal.as_deref());
        o.extend_from_slice(b",\"annotations\":null,\"audio\":null,\"function_call\":");
        match &c.function_call {
            None => o.extend_from_slice(b"null"),
            Some((name, args)) => {
                o.extend_from_slice(b"{\"name\":");
                string_or_empty(o, name.as_deref());
                o.extend_from_slice(b",\"arguments\":");
                string_or_empty(o, args.as_deref());
                o.push(b'}');
            }
        }
        if !c.tools.is_empty() {
            let mut tools: Vec<&ToolAcc> = c.tools.iter().collect();
            tools.sort_by_key(|t| t.index);
            o.extend_from_slice(b",\"tool_calls\":[");
            for (i, t) in tools.iter().enumerate() {
                if i > 0 {
                    o.push(b',');
                }
                o.extend_from_slice(b"{\"id\":");
                string_or_empty(o, t.id.as_deref());
                o.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                string_or_empty(o, t.name.as_deref());
                o.extend_from_slice(b",\"arguments\":");
                string_or_empty(o, t.arguments.as_deref());
                o.extend_from_slice(b"}}");
            }
            o.push(b']');
        }
        o.extend_from_slice(b",\"reasoning\":");
        string_or_null(o, c.reasoning.as_deref());
        if let Some(rc) = &c.reasoning_content {
            o.extend_from_slice(b",\"reasoning_content\":");
            string_or_null(o, Some(rc));
        }
        o.extend_from_slice(b"},\"logprobs\":");
        match &c.logprobs {
            None => o.extend_from_slice(b"null"),
            Some([content, refusal, _, _]) => {
                o.extend_from_slice(b"{\"content\":");
                list_or_null(o, content.as_deref());
                if let Some(r) = refusal {
                    o.extend_from_slice(b",\"refusal\":");
                    list_or_null(o, Some(r));
                }
                o.push(b'}');
            }
        }
        self.finish_fields(o, c);
        o.extend_from_slice(b",\"routed_experts\":null}");
    }

    fn completion_choice(&self, o: &mut Vec<u8>, c: &ChoiceAcc) {
        o.extend_from_slice(format!("{{\"index\":{},\"text\":", c.index).as_bytes());
        string_or_empty(o, c.text.as_deref());
        o.extend_from_slice(b",\"logprobs\":");
        match &c.logprobs {
            None => o.extend_from_slice(b"null"),
            Some(arrays) => {
                let keys = [
                    "{\"text_offset\":",
                    ",\"token_logprobs\":",
                    ",\"tokens\":",
                    ",\"top_logprobs\":",
                ];
                for (k, a) in keys.iter().zip(arrays) {
                    o.extend_from_slice(k.as_bytes());
                    list_or_null(o, a.as_deref());
                }
                o.push(b'}');
            }
        }
        self.finish_fields(o, c);
        o.extend_from_slice(b",\"prompt_logprobs\":null,\"prompt_token_ids\":");
        self.ids(o, c.prompt_token_ids.as_deref());
        o.extend_from_slice(b",\"routed_experts\":null}");
    }

    /// `finish_reason`, `stop_reason`, `token_ids`.
    fn finish_fields(&self, o: &mut Vec<u8>, c: &ChoiceAcc) {
        o.extend_from_slice(b",\"finish_reason\":");
        raw_or_null(o, c.finish_reason.as_deref());
        o.extend_from_slice(b",\"stop_reason\":");
        raw_or_null(o, c.stop_reason.as_deref());
        o.extend_from_slice(b",\"token_ids\":");
        match (&c.token_ids, self.expose_token_ids) {
            (Some(ids), true) => list_or_null(o, Some(ids)),
            _ => o.extend_from_slice(b"null"),
        }
    }
}

/// The engine's usage bytes with `prompt_tokens_details` / `completion_tokens_details`
/// appended as `null` when missing (vLLM's non-streaming usage has both keys).
pub fn usage_with_details(raw: &[u8], info: &UsageInfo) -> Vec<u8> {
    let mut u = raw.to_vec();
    let close = u.pop(); // the closing brace (raw values carry no trailing space)
    debug_assert_eq!(close, Some(b'}'));
    let mut any = info.any_key;
    for (has, key) in [
        (
            info.has_prompt_tokens_details,
            &b"\"prompt_tokens_details\":null"[..],
        ),
        (
            info.has_completion_tokens_details,
            b"\"completion_tokens_details\":null",
        ),
    ] {
        if !has {
            if any {
                u.push(b',');
            }
            u.extend_from_slice(key);
            any = true;
        }
    }
    u.push(b'}');
    u
}

fn raw_or_null(o: &mut Vec<u8>, v: Option<&[u8]>) {
    o.extend_from_slice(v.unwrap_or(b"null"));
}

fn string_or_null(o: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(s) => {
            o.push(b'"');
            o.extend_from_slice(s);
            o.push(b'"');
        }
        None => o.extend_from_slice(b"null"),
    }
}

fn string_or_empty(o: &mut Vec<u8>, v: Option<&[u8]>) {
    string_or_null(o, Some(v.unwrap_or(b"")));
}

fn list_or_null(o: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(s) => {
            o.push(b'[');
            o.extend_from_slice(s);
            o.push(b']');
        }
        None => o.extend_from_slice(b"null"),
    }
}
