//! Exposure: what of an engine event the streaming client sees (ID rewriting, dropped frames).

use crate::delta::{span_of, Event};

/// The client did not ask for token IDs: every non-null `token_ids` / `prompt_token_ids`
/// becomes `null`. Collects the byte spans to rewrite, sorted.
pub fn id_spans(payload: &[u8], ev: &Event<'_>, spans: &mut Vec<(usize, usize)>) {
    spans.clear();
    if let Some(r) = ev.prompt_token_ids {
        spans.push(span_of(payload, r));
    }
    for c in ev.choices.iter().flatten() {
        for r in [c.prompt_token_ids, c.token_ids].into_iter().flatten() {
            spans.push(span_of(payload, r));
        }
    }
    spans.sort_unstable();
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

/// Write one event as `data: <json>\n\n`, replacing each span with `null`. An event that
/// came in several `data:` lines keeps them (its JSON holds a LF between the lines).
pub fn write_event(out: &mut Vec<u8>, payload: &[u8], spans: &[(usize, usize)], data_lines: u32) {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    let mut at = 0;
    for &(a, b) in spans {
        out.extend_from_slice(&payload[at..a]);
        out.extend_from_slice(b"null");
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

    fn rewrite(s: &str) -> String {
        let ev = parse_event(s.as_bytes()).unwrap();
        let mut spans = Vec::new();
        id_spans(s.as_bytes(), &ev, &mut spans);
        let mut out = Vec::new();
        write_event(&mut out, s.as_bytes(), &spans, 1);
        String::from_utf8(out).unwrap()
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
    fn multi_line_data_keeps_its_lines() {
        let mut out = Vec::new();
        write_event(&mut out, b"{\"a\":\n1}", &[], 2);
        assert_eq!(out, b"data: {\"a\":\ndata: 1}\n\n");
    }
}
