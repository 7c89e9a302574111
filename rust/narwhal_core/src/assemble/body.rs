//! The final non-streaming body: vLLM 0.32's key order, written from the joined bytes.

use super::{Assembler, ChoiceAcc, ToolAcc};
use crate::delta::UsageInfo;
use crate::error::StreamError;

impl Assembler {
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
        o.extend_from_slice(format!("{{\"index\":{},\"message\":{{\"role\":", c.index).as_bytes());
        o.extend_from_slice(c.role.as_deref().unwrap_or(b"\"assistant\""));
        o.extend_from_slice(b",\"content\":");
        let content = if self.echo {
            // vLLM prepends the echoed text to a string, even to no content at all.
            Some(c.content.as_deref().unwrap_or(b""))
        } else {
            c.content
                .as_deref()
                .filter(|s| c.tools.is_empty() || !s.is_empty())
        };
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

#[cfg(test)]
mod tests {
    use crate::session::{Options, Route, StreamSession};

    const HEAD: &str = r#""id":"c1","object":"chat.completion.chunk","created":7,"model":"m""#;

    fn stream(route: Route, expose: bool, events: &[&str]) -> Result<String, String> {
        let mut s = StreamSession::new(Options {
            route,
            assemble: true,
            expose_token_ids: expose,
            drop_usage: false,
            require_token_ids: false,
            prompt_tokens: 4,
            strip_reasoning: false,
            echo: false,
        });
        let mut body = String::new();
        for e in events {
            body.push_str(&format!("data: {e}\n\n"));
        }
        body.push_str("data: [DONE]\n\n");
        s.feed(body.as_bytes());
        s.finish()
            .map(|b| String::from_utf8(b).unwrap())
            .map_err(|e| format!("{}: {e}", e.code()))
    }

    fn chat(choice: &str) -> String {
        format!(r#"{{{HEAD},"choices":[{choice}]}}"#)
    }

    #[test]
    fn strings_concatenate_per_key_keeping_escapes() {
        let body = stream(
            Route::Chat,
            false,
            &[
                &chat(r#"{"index":0,"delta":{"role":"assistant","content":""}}"#),
                &chat(r#"{"index":0,"delta":{"content":"a\"\ud83d","reasoning":"r1"}}"#),
                &chat(r#"{"index":0,"delta":{"content":"\udc4b","refusal":"no"}}"#),
                &chat(r#"{"index":0,"delta":{},"finish_reason":"stop","stop_reason":7}"#),
            ],
        )
        .unwrap();
        assert_eq!(
            body,
            concat!(
                r#"{"id":"c1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"#,
                r#""message":{"role":"assistant","content":"a\"\ud83d\udc4b","refusal":"no","annotations":null,"#,
                r#""audio":null,"function_call":null,"reasoning":"r1"},"logprobs":null,"finish_reason":"stop","#,
                r#""stop_reason":7,"token_ids":null,"routed_experts":null}],"service_tier":null,"#,
                r#""system_fingerprint":null,"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2,"#,
                r#""prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"#,
                r#""prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"#,
                r#""ec_transfer_params":null,"metrics":null}"#
            )
        );
    }

    #[test]
    fn tool_calls_group_by_index_in_order() {
        let body = stream(
            Route::Chat,
            false,
            &[
                &chat(r#"{"index":0,"delta":{"role":"assistant","content":""}}"#),
                &chat(r#"{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g"}}]}}"#),
                &chat(r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}}]}}"#),
                &chat(r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}},{"index":1,"function":{"arguments":"[]"}}]}}"#),
            ],
        )
        .unwrap();
        assert!(body.contains(concat!(
            r#""content":null,"refusal":null,"annotations":null,"audio":null,"function_call":null,"#,
            r#""tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},"#,
            r#"{"id":"b","type":"function","function":{"name":"g","arguments":"[]"}}],"reasoning":null}"#
        )));
        let missing = stream(
            Route::Chat,
            false,
            &[&chat(
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}"#,
            )],
        );
        assert!(missing
            .unwrap_err()
            .starts_with("malformed_engine_output: tool call 0"));
    }

    #[test]
    fn logprobs_usage_and_ids() {
        let lp = r#"{"token":"a","logprob":-1.0,"bytes":[97],"top_logprobs":[]}"#;
        let body = stream(
            Route::Chat,
            true,
            &[
                &format!(
                    r#"{{{HEAD},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}}}}],"prompt_token_ids":[1,2]}}"#
                ),
                &chat(&format!(
                    r#"{{"index":0,"delta":{{"content":"a"}},"logprobs":{{"content":[{lp}]}},"token_ids":[5]}}"#
                )),
                &chat(&format!(
                    r#"{{"index":0,"delta":{{"content":"a"}},"logprobs":{{"content":[{lp}]}},"token_ids":[6]}}"#
                )),
                &chat(r#"{"index":0,"delta":{},"finish_reason":"length"}"#),
                &format!(
                    r#"{{{HEAD},"choices":[],"usage":{{"prompt_tokens":2,"completion_tokens":2}},"system_fingerprint":"fp"}}"#
                ),
            ],
        )
        .unwrap();
        assert!(body.contains(&format!(
            r#""logprobs":{{"content":[{lp},{lp}]}},"finish_reason":"length""#
        )));
        assert!(body.contains(r#""token_ids":[5,6]"#));
        assert!(body.contains(concat!(
            r#""system_fingerprint":"fp","usage":{"prompt_tokens":2,"completion_tokens":2,"#,
            r#""prompt_tokens_details":null,"completion_tokens_details":null}"#
        )));
        assert!(body.contains(r#""prompt_token_ids":[1,2],"prompt_text":null"#));
    }

    #[test]
    fn completion_choices_in_index_order() {
        let ev = |i: u8, t: &str, lp: &str| {
            format!(
                r#"{{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{{"index":{i},"text":"{t}","logprobs":{lp},"finish_reason":null,"stop_reason":null,"prompt_token_ids":[9],"token_ids":[{i}]}}],"usage":null}}"#
            )
        };
        let lp =
            r#"{"text_offset":[0],"token_logprobs":[-1.5],"tokens":["a"],"top_logprobs":[null]}"#;
        let body = stream(
            Route::Completion,
            true,
            &[&ev(1, "b", "null"), &ev(0, "a", lp), &ev(0, "c", lp)],
        )
        .unwrap();
        assert!(body.contains(concat!(
            r#""choices":[{"index":0,"text":"ac","logprobs":{"text_offset":[0,0],"token_logprobs":[-1.5,-1.5],"#,
            r#""tokens":["a","a"],"top_logprobs":[null,null]},"finish_reason":null,"stop_reason":null,"#,
            r#""token_ids":[0,0],"prompt_logprobs":null,"prompt_token_ids":[9],"routed_experts":null},"#,
            r#"{"index":1,"text":"b","logprobs":null"#
        )));
    }

    #[test]
    fn usage_details_are_appended_when_missing() {
        use crate::delta::UsageInfo;
        let info = |p, c, any| UsageInfo {
            completion_tokens: None,
            prompt_tokens: None,
            has_prompt_tokens_details: p,
            cached_tokens: None,
            has_completion_tokens_details: c,
            any_key: any,
        };
        let u = super::usage_with_details;
        assert_eq!(
            u(b"{}", &info(false, false, false)),
            br#"{"prompt_tokens_details":null,"completion_tokens_details":null}"#
        );
        assert_eq!(
            u(br#"{"a":1}"#, &info(true, false, true)),
            br#"{"a":1,"completion_tokens_details":null}"#
        );
        assert_eq!(u(br#"{"a":1}"#, &info(true, true, true)), br#"{"a":1}"#);
    }
}
