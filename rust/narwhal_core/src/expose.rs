//! Exposure: what of an engine event the streaming client sees (ID rewriting, dropped frames).

use crate::delta::{span_of, Delta, Event};

/// What an edit writes in place of the bytes it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Put {
    /// `null`.
    Null,
    /// Nothing: the bytes are deleted.
    Nothing,
    /// The session's model name (the name the client sent), as a JSON string.
    Model,
}

/// One rewrite of an event's bytes: `start..end` becomes what `Put` says.
pub type Edit = (usize, usize, Put);

const NULL: &[u8] = b"null";

/// What exposure rewrites in the events it forwards (fixed per session).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rewrite {
    /// Every non-null `token_ids` becomes `null`.
    pub token_ids: bool,
    /// The top-level `prompt_token_ids` becomes `null`.
    pub prompt_token_ids: bool,
    /// Each choice's `prompt_token_ids` becomes `null`.
    pub choice_prompt_token_ids: bool,
    /// `include_reasoning: false`: `reasoning` / `reasoning_content` members leave the
    /// delta and every non-null `logprobs` becomes `null`.
    pub strip_reasoning: bool,
}

/// The edits `rewrite` makes to one event, sorted and disjoint.
pub fn edits(payload: &[u8], ev: &Event<'_>, rewrite: Rewrite, out: &mut Vec<Edit>) {
    out.clear();
    if rewrite.prompt_token_ids {
        if let Some(r) = ev.prompt_token_ids {
            push_null(payload, r, out);
        }
    }
    for c in ev.choices.iter().flatten() {
        if rewrite.strip_reasoning {
            if let Some(d) = &c.delta {
                reasoning_members(payload, d, out);
            }
            if let Some(r) = c.logprobs {
                push_null(payload, r, out);
            }
        }
        if rewrite.choice_prompt_token_ids {
            if let Some(r) = c.prompt_token_ids {
                push_null(payload, r, out);
            }
        }
        if rewrite.token_ids {
            if let Some(r) = c.token_ids {
                push_null(payload, r, out);
            }
        }
    }
    out.sort_unstable();
}

fn push_null(payload: &[u8], raw: &serde_json::value::RawValue, out: &mut Vec<Edit>) {
    let (a, b) = span_of(payload, raw);
    out.push((a, b, Put::Null));
}

/// The edit that makes the event's top-level `model` read `model` (a JSON string), when it
/// reads another name; an event without `model` (or with `null`) keeps it so.
pub fn model_edit(payload: &[u8], ev: &Event<'_>, model: &[u8]) -> Option<Edit> {
    let raw = ev.model?;
    if raw.get().as_bytes() == model {
        return None;
    }
    let (a, b) = span_of(payload, raw);
    Some((a, b, Put::Model))
}

/// Deletions of the delta's `reasoning` and `reasoning_content` members (key, value and
/// one adjoining comma), in byte order, so that the object stays valid JSON.
fn reasoning_members(payload: &[u8], d: &Delta<'_>, out: &mut Vec<Edit>) {
    let mut values: [Option<(usize, usize)>; 2] = [
        d.reasoning.map(|r| span_of(payload, r)),
        d.reasoning_content.map(|r| span_of(payload, r)),
    ];
    values.sort_unstable_by_key(|v| v.map(|(a, _)| a));
    let mut floor = 0;
    for (start, end) in values.into_iter().flatten() {
        let (a, b) = member_span(payload, start, end, floor);
        out.push((a, b, Put::Nothing));
        floor = b;
    }
}

fn back_ws(p: &[u8], mut i: usize) -> usize {
    while i > 0 && p[i - 1].is_ascii_whitespace() {
        i -= 1;
    }
    i
}

fn fwd_ws(p: &[u8], mut i: usize) -> usize {
    while i < p.len() && p[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The object member whose value is `start..end`, with the comma before it (unless that
/// comma lies below `floor`, already removed) or else the comma after it. The value comes
/// from a parsed object, so `"key" : value` precedes it.
fn member_span(p: &[u8], start: usize, end: usize, floor: usize) -> (usize, usize) {
    let colon = back_ws(p, start).saturating_sub(1);
    let close = back_ws(p, colon).saturating_sub(1);
    let mut key = close;
    while key > 0 {
        key -= 1;
        if p[key] == b'"' && p[..key].iter().rev().take_while(|&&c| c == b'\\').count() % 2 == 0 {
            break;
        }
    }
    let before = back_ws(p, key);
    if before > floor && p[before - 1] == b',' {
        return (before - 1, end);
    }
    let after = fwd_ws(p, end);
    if after < p.len() && p[after] == b',' {
        return (key, fwd_ws(p, after + 1));
    }
    (key, end)
}

/// A chat event that exists only to carry IDs: every choice has an empty delta, no finish
/// reason and no logprobs, and the event has no usage.
pub fn is_id_only(ev: &Event<'_>) -> bool {
    ev.usage.is_none()
        && ev.choices.as_ref().is_some_and(|cs| {
            !cs.is_empty()
                && cs.iter().all(|c| {
                    c.finish_reason.is_none()
                        && c.logprobs.is_none()
                        && !c.delta.as_ref().is_some_and(|d| d.any_value)
                })
        })
}

/// With `include_reasoning: false`, a chat event left with nothing to say: no choice has a
/// finish reason or a delta value besides reasoning. vLLM skips such an event (reasoning,
/// or markup tokens that yield no text) before it attaches logprobs, IDs or usage.
pub fn is_emptied_by_strip(ev: &Event<'_>) -> bool {
    ev.choices.as_ref().is_some_and(|cs| {
        !cs.is_empty()
            && cs.iter().all(|c| {
                c.finish_reason.is_none()
                    && !c
                        .delta
                        .as_ref()
                        .is_some_and(Delta::has_value_besides_reasoning)
            })
    })
}

/// Write one event as `data: <json>\n\n`, applying `edits` (`model`: what `Put::Model`
/// writes). An event that came in several `data:` lines keeps them (its JSON holds a LF
/// between the lines).
pub fn write_event(
    out: &mut Vec<u8>,
    payload: &[u8],
    edits: &[Edit],
    data_lines: u32,
    model: &[u8],
) {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    let mut at = 0;
    for &(a, b, put) in edits {
        out.extend_from_slice(&payload[at..a]);
        out.extend_from_slice(match put {
            Put::Null => NULL,
            Put::Nothing => b"",
            Put::Model => model,
        });
        at = b;
    }
    out.extend_from_slice(&payload[at..]);
    if data_lines > 1 {
        let body = out.split_off(start);
        for (i, line) in body.split(|&c| c == b'\n').enumerate() {
            if i > 0 {
                out.extend_from_slice(b"\ndata: ");
            }
            out.extend_from_slice(line);
        }
    }
    out.extend_from_slice(b"\n\n");
}

/// The end-of-stream marker as the client receives it.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::parse_event;

    const HIDE_IDS: Rewrite = Rewrite {
        token_ids: true,
        prompt_token_ids: true,
        choice_prompt_token_ids: true,
        strip_reasoning: false,
    };

    fn rewrite_with(s: &str, rewrite: Rewrite) -> String {
        let ev = parse_event(s.as_bytes()).unwrap();
        let mut e = Vec::new();
        edits(s.as_bytes(), &ev, rewrite, &mut e);
        let mut out = Vec::new();
        write_event(&mut out, s.as_bytes(), &e, 1, b"");
        String::from_utf8(out).unwrap()
    }

    fn rewrite(s: &str) -> String {
        rewrite_with(s, HIDE_IDS)
    }

    #[test]
    fn ids_become_null_in_place() {
        assert_eq!(
            rewrite(r#"{"choices":[{"index":0,"delta":{"content":"é"},"token_ids":[1, 2]}],"prompt_token_ids":[3]}"#),
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"é\"},\"token_ids\":null}],\"prompt_token_ids\":null}\n\n"
        );
        assert_eq!(
            rewrite(r#"{"prompt_token_ids":[3],"choices":[{"text":"a","prompt_token_ids":[9],"token_ids":null}],"usage":null}"#),
            "data: {\"prompt_token_ids\":null,\"choices\":[{\"text\":\"a\",\"prompt_token_ids\":null,\"token_ids\":null}],\"usage\":null}\n\n"
        );
        let echo = Rewrite {
            choice_prompt_token_ids: false,
            ..HIDE_IDS
        };
        assert_eq!(
            rewrite_with(
                r#"{"choices":[{"text":"a","prompt_token_ids":[9],"token_ids":[4]}]}"#,
                echo
            ),
            "data: {\"choices\":[{\"text\":\"a\",\"prompt_token_ids\":[9],\"token_ids\":null}]}\n\n"
        );
    }

    #[test]
    fn strip_removes_reasoning_members_and_nulls_logprobs() {
        let strip = Rewrite {
            strip_reasoning: true,
            prompt_token_ids: false,
            ..HIDE_IDS
        };
        let cases = [
            (r#"{"reasoning":"a"}"#, "{}"),
            (r#"{"reasoning":"a","content":"b"}"#, r#"{"content":"b"}"#),
            (r#"{"content":"b","reasoning":"a"}"#, r#"{"content":"b"}"#),
            (r#"{"reasoning":"a","reasoning_content":"a"}"#, "{}"),
            (
                r#"{"content":"b","reasoning":"a","reasoning_content":"a","x":1}"#,
                r#"{"content":"b","x":1}"#,
            ),
            (r#"{"reasoning_content":"a\"","reasoning":"a"}"#, "{}"),
            (
                r#"{ "r\u0065asoning" : "a" , "content":"b" }"#,
                r#"{ "content":"b" }"#,
            ),
            (
                "{\"content\":\"b\",\n \"reasoning\" :\"a\\\\\"}",
                "{\"content\":\"b\"}",
            ),
            (
                r#"{"content":"b","reasoning":null}"#,
                r#"{"content":"b","reasoning":null}"#,
            ),
        ];
        for (delta, want) in cases {
            let ev = format!(
                r#"{{"choices":[{{"index":0,"delta":{delta},"logprobs":{{"content":[]}},"token_ids":[5]}}],"prompt_token_ids":[1]}}"#
            );
            let got = rewrite_with(&ev, strip);
            let want = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{want},\"logprobs\":null,\"token_ids\":null}}],\"prompt_token_ids\":[1]}}\n\n"
            );
            assert_eq!(got, want, "{delta}");
            let out = got.strip_prefix("data: ").unwrap().trim_end();
            serde_json::from_str::<serde_json::Value>(out).unwrap();
        }
    }

    #[test]
    fn id_only_detection() {
        let yes = |s: &str| is_id_only(&parse_event(s.as_bytes()).unwrap());
        assert!(yes(
            r#"{"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[5]}]}"#
        ));
        assert!(!yes(
            r#"{"choices":[{"delta":{},"finish_reason":"stop","token_ids":[5]}]}"#
        ));
        assert!(!yes(
            r#"{"choices":[{"delta":{},"logprobs":{"content":[]},"token_ids":[5]}]}"#
        ));
        assert!(!yes(
            r#"{"choices":[{"delta":{}}],"usage":{"completion_tokens":1}}"#
        ));
        assert!(!yes(
            r#"{"choices":[{"delta":{"content":""},"token_ids":[5]}]}"#
        ));
        assert!(!yes(r#"{"choices":[]}"#));
    }

    #[test]
    fn emptied_by_strip_detection() {
        let yes = |s: &str| is_emptied_by_strip(&parse_event(s.as_bytes()).unwrap());
        assert!(yes(
            r#"{"choices":[{"delta":{"reasoning":"a"},"logprobs":{"content":[]},"token_ids":[5]}],"usage":{"completion_tokens":1}}"#
        ));
        assert!(yes(r#"{"choices":[{"delta":{}}]}"#));
        assert!(!yes(
            r#"{"choices":[{"delta":{"reasoning":"a"},"finish_reason":"length"}]}"#
        ));
        assert!(!yes(
            r#"{"choices":[{"delta":{"reasoning":"a","content":""}}]}"#
        ));
        assert!(!yes(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#));
        assert!(!yes(r#"{"choices":[],"usage":{"completion_tokens":1}}"#));
    }

    #[test]
    fn model_is_renamed_where_it_differs() {
        let alias = br#""llama-8b""#;
        let cases = [
            (
                r#"{"id":"c","model":"meta-llama/L","choices":[]}"#,
                r#"{"id":"c","model":"llama-8b","choices":[]}"#,
            ),
            (
                r#"{ "model" : "x\"y" ,"choices":[]}"#,
                r#"{ "model" : "llama-8b" ,"choices":[]}"#,
            ),
            (
                r#"{"model":null,"choices":[]}"#,
                r#"{"model":null,"choices":[]}"#,
            ),
            (
                r#"{"model":"llama-8b","choices":[]}"#,
                r#"{"model":"llama-8b","choices":[]}"#,
            ),
            (r#"{"choices":[]}"#, r#"{"choices":[]}"#),
        ];
        for (event, want) in cases {
            let ev = parse_event(event.as_bytes()).unwrap();
            let e: Vec<Edit> = model_edit(event.as_bytes(), &ev, alias)
                .into_iter()
                .collect();
            let mut out = Vec::new();
            write_event(&mut out, event.as_bytes(), &e, 1, alias);
            assert_eq!(out, format!("data: {want}\n\n").as_bytes(), "{event}");
        }
    }

    #[test]
    fn multi_line_data_keeps_its_lines() {
        let mut out = Vec::new();
        write_event(&mut out, b"{\"a\":\n1}", &[], 2, b"");
        assert_eq!(out, b"data: {\"a\":\ndata: 1}\n\n");
    }
}
