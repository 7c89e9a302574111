//! Delta parsing: one engine event (chat or completion chunk) into borrowed, type-checked parts.
//!
//! Every value is kept as a `&RawValue` slice of the event's own bytes, so exposure can
//! rewrite spans in place and assembly can concatenate the engine's exact bytes. Parsing
//! checks the JSON types of the fields the router reads; deeper checks live with their users.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::StreamError;

/// A borrowed JSON value of the event.
pub type Raw<'a> = &'a RawValue;

/// The JSON kind of a raw value, by its first byte (raw values carry no leading space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    List,
    Object,
}

impl Kind {
    /// Kind of a raw JSON value.
    pub fn of(raw: &RawValue) -> Kind {
        match raw.get().as_bytes().first() {
            Some(b'n') => Kind::Null,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'"') => Kind::String,
            Some(b'[') => Kind::List,
            Some(b'{') => Kind::Object,
            _ => Kind::Number,
        }
    }

    /// The word used in error messages ("a string", "a list", ...).
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a Boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::List => "a list",
            Kind::Object => "an object",
        }
    }
}

/// The bytes between the quotes of a raw JSON string (still JSON-escaped).
pub fn string_inner(raw: &RawValue) -> &[u8] {
    let b = raw.get().as_bytes();
    &b[1..b.len() - 1]
}

/// The bytes between the brackets of a raw JSON list, or empty when the list is empty.
pub fn list_inner(raw: &RawValue) -> &[u8] {
    let b = raw.get().as_bytes();
    let inner = &b[1..b.len() - 1];
    if inner.iter().all(u8::is_ascii_whitespace) {
        &[]
    } else {
        inner
    }
}

/// A raw value that is a JSON integer (no fraction, no exponent), as i128 when it fits.
pub fn as_integer(raw: &RawValue) -> Option<i128> {
    let s = raw.get();
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let saturated = if s.starts_with('-') {
        i128::MIN
    } else {
        i128::MAX
    };
    Some(s.parse::<i128>().unwrap_or(saturated))
}

/// A raw value that is a nonnegative JSON integer within u64.
pub fn as_u64(raw: &RawValue) -> Option<u64> {
    match as_integer(raw) {
        Some(v) if v >= 0 && v <= i128::from(u64::MAX) => Some(v as u64),
        _ => None,
    }
}

/// An object key, borrowed unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

fn next_raw<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Raw<'de>>, A::Error> {
    map.next_value::<Option<Raw<'de>>>()
}

/// Next value, which must be null or of `kind`; `what` names it in the error.
fn next_typed<'de, A: MapAccess<'de>>(
    map: &mut A,
    kind: Kind,
    what: &str,
) -> Result<Option<Raw<'de>>, A::Error> {
    let v = next_raw(map)?;
    match v {
        Some(r) if Kind::of(r) != kind => Err(de::Error::custom(format_args!(
            "{what} must be {}, got {}",
            kind.noun(),
            Kind::of(r).noun()
        ))),
        _ => Ok(v),
    }
}

/// One engine event, top level. Absent and `null` are both `None`.
#[derive(Debug, Default)]
pub struct Event<'a> {
    pub id: Option<Raw<'a>>,
    pub object: Option<Raw<'a>>,
    pub created: Option<Raw<'a>>,
    pub model: Option<Raw<'a>>,
    pub choices: Option<Vec<Choice<'a>>>,
    /// Checked to be an object.
    pub usage: Option<Raw<'a>>,
    pub system_fingerprint: Option<Raw<'a>>,
    pub prompt_token_ids: Option<Raw<'a>>,
    pub error: Option<Raw<'a>>,
    pub message: Option<Raw<'a>>,
}

impl Event<'_> {
    /// vLLM's `{"error": {...}}` or SGLang's flat `{"object": "error", ...}`.
    pub fn is_error(&self) -> bool {
        self.error.is_some() || self.object.is_some_and(|o| o.get() == "\"error\"")
    }

    /// `choices: []` with a usage object: the final usage frame.
    pub fn is_usage_only(&self) -> bool {
        self.usage.is_some() && self.choices.as_ref().is_some_and(|c| c.is_empty())
    }
}

/// One element of `choices`. Fields typed by their first byte during parsing.
#[derive(Debug, Default)]
pub struct Choice<'a> {
    pub index: Option<Raw<'a>>,
    pub delta: Option<Delta<'a>>,
    /// Completion text, checked to be a string.
    pub text: Option<Raw<'a>>,
    pub logprobs: Option<Raw<'a>>,
    /// Checked to be a string.
    pub finish_reason: Option<Raw<'a>>,
    pub stop_reason: Option<Raw<'a>>,
    /// SGLang's name for `stop_reason`.
    pub matched_stop: Option<Raw<'a>>,
    pub token_ids: Option<Raw<'a>>,
    pub prompt_token_ids: Option<Raw<'a>>,
    /// The first key outside the known set that carries a non-null value.
    pub unknown: Option<Cow<'a, str>>,
}

/// A chat choice's `delta`. String fields checked to be strings, `tool_calls` a list,
/// `function_call` an object.
#[derive(Debug, Default)]
pub struct Delta<'a> {
    pub role: Option<Raw<'a>>,
    pub content: Option<Raw<'a>>,
    pub reasoning: Option<Raw<'a>>,
    pub reasoning_content: Option<Raw<'a>>,
    pub refusal: Option<Raw<'a>>,
    pub tool_calls: Option<Raw<'a>>,
    pub function_call: Option<Raw<'a>>,
    /// The first key outside the known set that carries a non-null value.
    pub unknown: Option<Cow<'a, str>>,
    /// Some key carries a non-null value.
    pub any_value: bool,
}

impl Delta<'_> {
    /// The delta carries generated output (text, reasoning, refusal or a call), and is not
    /// the role chunk.
    pub fn carries_output(&self) -> bool {
        self.role.is_none()
            && (self.content.is_some()
                || self.reasoning.is_some()
                || self.reasoning_content.is_some()
                || self.refusal.is_some()
                || self.tool_calls.is_some()
                || self.function_call.is_some())
    }

    /// Some key other than `reasoning` / `reasoning_content` carries a value.
    pub fn has_value_besides_reasoning(&self) -> bool {
        self.content.is_some() || self.has_other_value()
    }

    /// Only `content` carries a value: the shape of vLLM's chat echo chunk.
    pub fn is_content_only(&self) -> bool {
        self.content.is_some()
            && self.reasoning.is_none()
            && self.reasoning_content.is_none()
            && !self.has_other_value()
    }

    /// A value under a key other than content and the reasoning keys.
    fn has_other_value(&self) -> bool {
        self.role.is_some()
            || self.refusal.is_some()
            || self.tool_calls.is_some()
            || self.function_call.is_some()
            || self.unknown.is_some()
    }
}

impl Choice<'_> {
    /// This choice carries generated output (chat delta or completion text).
    pub fn carries_output(&self) -> bool {
        self.text.is_some() || self.delta.as_ref().is_some_and(Delta::carries_output)
    }
}

impl<'de> Deserialize<'de> for Event<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Event<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an event object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event<'de>, A::Error> {
                let mut ev = Event::default();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    match &*k {
                        "choices" => {
                            ev.choices = map
                                .next_value::<Option<ChoiceList<'de>>>()?
                                .map(|ChoiceList(v)| v)
                        }
                        "id" => ev.id = next_raw(&mut map)?,
                        "object" => ev.object = next_raw(&mut map)?,
                        "created" => ev.created = next_raw(&mut map)?,
                        "model" => ev.model = next_raw(&mut map)?,
                        "usage" => ev.usage = next_typed(&mut map, Kind::Object, "usage")?,
                        "system_fingerprint" => ev.system_fingerprint = next_raw(&mut map)?,
                        "prompt_token_ids" => ev.prompt_token_ids = next_raw(&mut map)?,
                        "error" => ev.error = next_raw(&mut map)?,
                        "message" => ev.message = next_raw(&mut map)?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ev)
            }
        }
        d.deserialize_map(V)
    }
}

/// `choices`: a list whose elements must be objects.
struct ChoiceList<'a>(Vec<Choice<'a>>);

impl<'de> Deserialize<'de> for ChoiceList<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChoiceList<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("choices as a list")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::with_capacity(1);
                while let Some(c) = seq.next_element::<Choice<'de>>()? {
                    v.push(c);
                }
                Ok(ChoiceList(v))
            }
        }
        d.deserialize_seq(V)
    }
}

impl<'de> Deserialize<'de> for Choice<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Choice<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("each choice as an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Choice<'de>, A::Error> {
                let mut c = Choice::default();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    match &*k {
                        "index" => c.index = next_raw(&mut map)?,
                        "delta" => c.delta = map.next_value::<Option<Delta<'de>>>()?,
                        "text" => c.text = next_typed(&mut map, Kind::String, "text")?,
                        "logprobs" => c.logprobs = next_raw(&mut map)?,
                        "finish_reason" => {
                            c.finish_reason = next_typed(&mut map, Kind::String, "finish_reason")?
                        }
                        "stop_reason" => c.stop_reason = next_raw(&mut map)?,
                        "matched_stop" => c.matched_stop = next_raw(&mut map)?,
                        "token_ids" => c.token_ids = next_raw(&mut map)?,
                        "prompt_token_ids" => c.prompt_token_ids = next_raw(&mut map)?,
                        _ => {
                            if next_raw(&mut map)?.is_some() && c.unknown.is_none() {
                                c.unknown = Some(k);
                            }
                        }
                    }
                }
                Ok(c)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Delta<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Delta<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("delta as an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Delta<'de>, A::Error> {
                let mut d = Delta::default();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    let v = match &*k {
                        "role" => {
                            d.role = next_typed(&mut map, Kind::String, "delta.role")?;
                            d.role
                        }
                        "content" => {
                            d.content = next_typed(&mut map, Kind::String, "delta.content")?;
                            d.content
                        }
                        "reasoning" => {
                            d.reasoning = next_typed(&mut map, Kind::String, "delta.reasoning")?;
                            d.reasoning
                        }
                        "reasoning_content" => {
                            d.reasoning_content =
                                next_typed(&mut map, Kind::String, "delta.reasoning_content")?;
                            d.reasoning_content
                        }
                        "refusal" => {
                            d.refusal = next_typed(&mut map, Kind::String, "delta.refusal")?;
                            d.refusal
                        }
                        "tool_calls" => {
                            d.tool_calls = next_typed(&mut map, Kind::List, "delta.tool_calls")?;
                            d.tool_calls
                        }
                        "function_call" => {
                            d.function_call =
                                next_typed(&mut map, Kind::Object, "delta.function_call")?;
                            d.function_call
                        }
                        _ => {
                            let v = next_raw(&mut map)?;
                            if v.is_some() && d.unknown.is_none() {
                                d.unknown = Some(k);
                            }
                            v
                        }
                    };
                    d.any_value |= v.is_some();
                }
                Ok(d)
            }
        }
        d.deserialize_map(V)
    }
}

/// What the router reads from a usage object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageInfo {
    /// `completion_tokens`, when present and not null.
    pub completion_tokens: Option<u64>,
    /// `prompt_tokens`, when present and a nonnegative integer (informational: never fails).
    pub prompt_tokens: Option<u64>,
    pub has_prompt_tokens_details: bool,
    /// `prompt_tokens_details.cached_tokens`, when a nonnegative integer (informational).
    pub cached_tokens: Option<u64>,
    pub has_completion_tokens_details: bool,
    /// The object has at least one key.
    pub any_key: bool,
}

/// Read a usage object (already checked to be an object): `completion_tokens` must be a
/// nonnegative integer or null.
pub fn parse_usage(raw: &RawValue) -> Result<UsageInfo, StreamError> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = (
            UsageInfo,
            Option<Raw<'de>>,
            Option<Raw<'de>>,
            Option<Raw<'de>>,
        );
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("usage as an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut u = UsageInfo::default();
            let mut ct = None;
            let mut pt = None;
            let mut details = None;
            while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                u.any_key = true;
                match &*k {
                    "completion_tokens" => ct = next_raw(&mut map)?,
                    "prompt_tokens" => pt = next_raw(&mut map)?,
                    "prompt_tokens_details" => {
                        u.has_prompt_tokens_details = true;
                        details = next_raw(&mut map)?;
                    }
                    "completion_tokens_details" => {
                        u.has_completion_tokens_details = true;
                        map.next_value::<IgnoredAny>()?;
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok((u, ct, pt, details))
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let (mut info, ct, pt, details) = de::Deserializer::deserialize_map(&mut de, V)
        .map_err(|e| StreamError::malformed(format!("usage is not valid: {e}")))?;
    if let Some(r) = ct {
        info.completion_tokens = Some(as_u64(r).ok_or_else(|| {
            StreamError::malformed(format!(
                "usage.completion_tokens must be a nonnegative integer, got {}",
                r.get()
            ))
        })?);
    }
    info.prompt_tokens = pt.and_then(as_u64);
    info.cached_tokens = details.and_then(cached_tokens);
    Ok(info)
}

/// `cached_tokens` of a `prompt_tokens_details` object, when a nonnegative integer.
fn cached_tokens(details: Raw<'_>) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Details<'a> {
        #[serde(borrow, default)]
        cached_tokens: Option<Raw<'a>>,
    }
    if Kind::of(details) != Kind::Object {
        return None;
    }
    serde_json::from_str::<Details<'_>>(details.get())
        .ok()
        .and_then(|d| d.cached_tokens)
        .and_then(as_u64)
}

/// The message of an engine error event: `error.message`, a string `error`, or a flat
/// `message`.
pub fn error_message(ev: &Event<'_>) -> String {
    #[derive(serde::Deserialize)]
    struct Inner<'a> {
        #[serde(borrow, default)]
        message: Option<Raw<'a>>,
    }
    let as_string = |r: Option<Raw<'_>>| {
        r.filter(|r| Kind::of(r) == Kind::String)
            .and_then(|r| serde_json::from_str::<String>(r.get()).ok())
    };
    let from_error = ev.error.and_then(|e| match Kind::of(e) {
        Kind::Object => serde_json::from_str::<Inner<'_>>(e.get())
            .ok()
            .and_then(|i| as_string(i.message)),
        _ => as_string(Some(e)),
    });
    from_error
        .or_else(|| as_string(ev.message))
        .unwrap_or_else(|| "engine reported an error".to_owned())
}

/// Parse one event payload. UTF-8, JSON syntax and the field types above are checked.
pub fn parse_event(payload: &[u8]) -> Result<Event<'_>, StreamError> {
    let text = std::str::from_utf8(payload)
        .map_err(|_| StreamError::malformed("engine event is not valid UTF-8"))?;
    serde_json::from_str::<Event<'_>>(text)
        .map_err(|e| StreamError::malformed(format!("engine event is not valid: {e}")))
}

/// Byte offset of a raw value inside the payload it was parsed from.
pub fn span_of(payload: &[u8], raw: &RawValue) -> (usize, usize) {
    let start = raw.get().as_ptr() as usize - payload.as_ptr() as usize;
    (start, start + raw.get().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        parse_event(s.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn parses_a_vllm_chat_chunk() {
        let s = br#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" pa"},"logprobs":null,"finish_reason":null,"token_ids":[668]}]}"#;
        let ev = parse_event(s).unwrap();
        let c = &ev.choices.as_ref().unwrap()[0];
        assert_eq!(c.index.unwrap().get(), "0");
        assert_eq!(
            string_inner(c.delta.as_ref().unwrap().content.unwrap()),
            b" pa"
        );
        assert!(c.carries_output());
        assert!(c.logprobs.is_none());
        let (a, b) = span_of(s, c.token_ids.unwrap());
        assert_eq!(&s[a..b], b"[668]");
        assert!(!ev.is_error() && !ev.is_usage_only());
    }

    #[test]
    fn role_chunk_and_empty_delta_carry_no_output() {
        let ev = parse_event(br#"{"choices":[{"delta":{"role":"assistant","content":""}},{"delta":{}},{"delta":{"content":null}}]}"#).unwrap();
        let cs = ev.choices.unwrap();
        assert!(cs.iter().all(|c| !c.carries_output()));
        assert!(!cs[1].delta.as_ref().unwrap().any_value);
        assert!(!cs[2].delta.as_ref().unwrap().any_value);
    }

    #[test]
    fn unknown_fields_with_values_are_noted() {
        let ev = parse_event(br#"{"choices":[{"delta":{"audio":null,"annotations":[1]},"extra":null,"weird":{"a":1}}]}"#).unwrap();
        let c = &ev.choices.unwrap()[0];
        assert_eq!(c.unknown.as_deref(), Some("weird"));
        assert_eq!(
            c.delta.as_ref().unwrap().unknown.as_deref(),
            Some("annotations")
        );
    }

    #[test]
    fn escaped_keys_are_recognised() {
        let ev = parse_event(br#"{"choices":[{"tok\u0065n_ids":[1]}]}"#).unwrap();
        assert!(ev.choices.unwrap()[0].token_ids.is_some());
    }

    #[test]
    fn type_errors_are_malformed() {
        assert!(err(r#"{"choices":{}}"#).contains("not valid"));
        assert!(err(r#"{"choices":[1]}"#).contains("object"));
        assert!(err(r#"{"choices":[{"delta":[]}]}"#).contains("delta"));
        assert!(err(r#"{"choices":[{"delta":{"content":5}}]}"#)
            .contains("delta.content must be a string"));
        assert!(err(r#"{"choices":[{"delta":{"tool_calls":{}}}]}"#)
            .contains("tool_calls must be a list"));
        assert!(err(r#"{"choices":[{"finish_reason":1}]}"#).contains("finish_reason"));
        assert!(err(r#"{"usage":[]}"#).contains("usage must be an object"));
        assert!(err("[1]").contains("not valid"));
        assert!(err("{\"a\":").contains("not valid"));
        assert!(parse_event(b"{\"a\":\"\xff\"}").is_err());
    }

    #[test]
    fn error_and_usage_frames() {
        assert!(parse_event(br#"{"error": {"message": "x", "code": 500}}"#)
            .unwrap()
            .is_error());
        assert!(parse_event(br#"{"object":"error","message":"x"}"#)
            .unwrap()
            .is_error());
        assert!(
            parse_event(br#"{"choices":[],"usage":{"completion_tokens":3}}"#)
                .unwrap()
                .is_usage_only()
        );
        assert!(!parse_event(br#"{"choices":[],"usage":null}"#)
            .unwrap()
            .is_usage_only());
    }

    #[test]
    fn usage_and_error_messages() {
        let r = |s: &'static str| serde_json::from_str::<&RawValue>(s).unwrap();
        let u = parse_usage(r(
            r#"{"prompt_tokens":1,"completion_tokens":5,"prompt_tokens_details":null}"#,
        ))
        .unwrap();
        assert_eq!(u.completion_tokens, Some(5));
        assert!(u.has_prompt_tokens_details && !u.has_completion_tokens_details && u.any_key);
        assert!(!parse_usage(r("{}")).unwrap().any_key);
        assert!(parse_usage(r(r#"{"completion_tokens":-1}"#)).is_err());
        assert!(parse_usage(r(r#"{"completion_tokens":"5"}"#)).is_err());
        let msg = |s: &str| error_message(&parse_event(s.as_bytes()).unwrap());
        assert_eq!(
            msg(r#"{"error": {"message": "boom \u00e9", "code": 500}}"#),
            "boom é"
        );
        assert_eq!(msg(r#"{"object":"error","message":"flat"}"#), "flat");
        assert_eq!(msg(r#"{"error":"plain"}"#), "plain");
        assert_eq!(msg(r#"{"error":{"code":1}}"#), "engine reported an error");
    }

    #[test]
    fn integers() {
        let r = |s: &'static str| serde_json::from_str::<&RawValue>(s).unwrap();
        assert_eq!(as_u64(r("7")), Some(7));
        assert_eq!(as_u64(r("-1")), None);
        assert_eq!(as_u64(r("1.0")), None);
        assert_eq!(as_u64(r("18446744073709551615")), Some(u64::MAX));
        assert_eq!(as_u64(r("18446744073709551616")), None);
        assert_eq!(
            as_u64(r("123456789012345678901234567890123456789012")),
            None
        );
        assert_eq!(as_integer(r("-3")), Some(-3));
        assert_eq!(list_inner(r("[ ]")), b"");
        assert_eq!(list_inner(r("[1, 2]")), b"1, 2");
    }
}
