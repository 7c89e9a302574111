//! Unit tests of `session.rs`: one feed per read, exposure, assembly, options.
use super::*;

fn session(assemble: bool, expose: bool, require: bool) -> StreamSession {
    StreamSession::new(Options {
        route: Route::Chat,
        assemble,
        expose_token_ids: expose,
        drop_usage: true,
        require_token_ids: require,
        prompt_tokens: 0,
        strip_reasoning: false,
        echo: false,
    })
}

const ROLE: &str = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1,2]}"#;
const TEXT: &str = r#"{"choices":[{"index":0,"delta":{"content":"hi"},"token_ids":[7,8]}]}"#;
const IDS_ONLY: &str = r#"{"choices":[{"index":0,"delta":{},"logprobs":null,"token_ids":[9]}]}"#;
const USAGE: &str = r#"{"choices":[],"usage":{"completion_tokens":3}}"#;

fn sse(events: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    for e in events {
        b.extend_from_slice(format!("data: {e}\r\n\r\n").as_bytes());
    }
    b
}

#[test]
fn streaming_rewrites_drops_and_counts() {
    let mut s = session(false, false, true);
    let body = [
        sse(&[ROLE, TEXT, IDS_ONLY, USAGE]),
        b"data: [DONE]\r\n\r\n".to_vec(),
    ]
    .concat();
    let (out, n, state) = s.feed(&body);
    let want = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"prompt_token_ids\":null}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"token_ids\":null}]}\n\n",
        "data: [DONE]\n\n"
    );
    assert_eq!(std::str::from_utf8(out).unwrap(), want);
    assert_eq!((n, state), (3, State::Done));
    assert_eq!(
        (
            s.events(),
            s.output_tokens(),
            s.engine_usage_completion_tokens()
        ),
        (4, 3, Some(3))
    );
    assert_eq!(s.feed(TEXT.as_bytes()), (&b""[..], 0, State::Done));
}

#[test]
fn exposed_ids_and_byte_splits() {
    let body = [
        sse(&[ROLE, TEXT, IDS_ONLY]),
        b"data: [DONE]\r\n\r\n".to_vec(),
    ]
    .concat();
    let mut whole = session(false, true, true);
    let want = whole.feed(&body).0.to_vec();
    assert_eq!(
        want,
        [
            sse(&[ROLE, TEXT, IDS_ONLY]),
            b"data: [DONE]\r\n\r\n".to_vec()
        ]
        .concat()
        .replace_crlf()
    );
    let mut s = session(false, true, true);
    let mut got = Vec::new();
    let mut ids = 0;
    for b in &body {
        let (out, n, _) = s.feed(std::slice::from_ref(b));
        got.extend_from_slice(out);
        ids += n;
    }
    assert_eq!((got, ids, s.state()), (want, 3, State::Done));
}

#[test]
fn an_alias_is_the_model_of_every_event_and_of_the_body() {
    let head = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"canonical","#;
    let role = format!(
        r#"{head}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}}}}],"prompt_token_ids":[1]}}"#
    );
    let text = format!(
        r#"{head}"choices":[{{"index":0,"delta":{{"content":"hi"}},"finish_reason":"stop","token_ids":[7]}}]}}"#
    );
    let body = [sse(&[&role, &text]), b"data: [DONE]\n\n".to_vec()].concat();
    for expose in [false, true] {
        let mut s = session(false, expose, true);
        s.rename_model("llama \"8b\"");
        let out = String::from_utf8(s.feed(&body).0.to_vec()).unwrap();
        assert_eq!(out.matches(r#""model":"llama \"8b\"""#).count(), 2, "{out}");
        assert!(!out.contains("canonical"));
    }
    let mut s = session(true, false, true);
    s.rename_model("llama-8b");
    s.feed(&body);
    let assembled = String::from_utf8(s.finish().unwrap()).unwrap();
    assert!(
        assembled.contains(r#""model":"llama-8b","choices""#),
        "{assembled}"
    );
    let mut plain = session(false, true, true);
    assert_eq!(plain.feed(&body).0.to_vec(), body.replace_crlf()); // no rename: as sent
}

trait ReplaceCrlf {
    fn replace_crlf(self) -> Vec<u8>;
}
impl ReplaceCrlf for Vec<u8> {
    fn replace_crlf(self) -> Vec<u8> {
        String::from_utf8(self)
            .unwrap()
            .replace("\r\n", "\n")
            .into_bytes()
    }
}

#[test]
fn failures_stop_the_stream() {
    let mut s = session(false, false, true);
    let bad = r#"{"choices":[{"index":0,"delta":{"content":"x"},"token_ids":[true]}]}"#;
    let (out, n, state) = s.feed(&sse(&[TEXT, bad, TEXT]));
    assert_eq!((!out.is_empty(), n, state), (true, 2, State::Failed));
    let f = s.failure().unwrap();
    assert_eq!(f.code(), "malformed_engine_output");
    assert!(f.to_string().contains("Boolean"));
    assert_eq!(s.events(), 1);
    let mut s = session(false, false, true);
    s.feed(&sse(&[
        r#"{"choices":[{"index":0,"delta":{"content":"x"}}]}"#,
    ]));
    assert!(s.failure().unwrap().to_string().contains("no token_ids"));
    let mut s = session(false, false, false);
    assert_eq!(
        s.feed(&sse(&[
            r#"{"choices":[{"index":0,"delta":{"content":"x"}}]}"#
        ]))
        .1,
        1
    );
}

#[test]
fn assembly_errors_and_engine_errors() {
    let mut s = session(true, false, true);
    s.feed(&sse(&[ROLE, TEXT]));
    assert_eq!(
        s.finish().unwrap_err().to_string(),
        "engine stream ended before [DONE]"
    );
    let mut s = session(true, false, true);
    let err = r#"{"error": {"message": "oops", "code": 500}}"#;
    let (out, _, state) = s.feed(&[sse(&[ROLE, err]), b"data: [DONE]\n\n".to_vec()].concat());
    assert_eq!((out, state), (&b""[..], State::Done));
    assert_eq!(s.finish().unwrap_err(), StreamError::Engine("oops".into()));
    assert_eq!(s.engine_error(), Some(err.as_bytes()));
    let mut s = session(true, false, true);
    s.feed(&sse(&[
        r#"{"choices":[{"index":0,"delta":{"audio":{"id":"a"}}}]}"#,
    ]));
    assert_eq!(s.failure().unwrap().code(), "unsupported_engine_field");
    assert_eq!(
        session(false, false, false).finish().unwrap_err(),
        StreamError::NotAssembling
    );
}

fn with(route: Route, f: impl FnOnce(&mut Options)) -> StreamSession {
    let mut o = Options {
        route,
        assemble: false,
        expose_token_ids: false,
        drop_usage: false,
        require_token_ids: true,
        prompt_tokens: 0,
        strip_reasoning: false,
        echo: false,
    };
    f(&mut o);
    StreamSession::new(o)
}

const REASONING: &str = r#"{"choices":[{"index":0,"delta":{"reasoning":"hm"},"logprobs":{"content":[]},"token_ids":[4,5]}]}"#;
const CONTENT_LP: &str = r#"{"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":{"content":[]},"token_ids":[7]}]}"#;
const FINISH: &str = r#"{"choices":[{"index":0,"delta":{"reasoning":"x"},"logprobs":null,"finish_reason":"length","token_ids":[8]}]}"#;

#[test]
fn strip_reasoning_hides_reasoning_ids_and_logprobs_but_counts_ids() {
    for expose in [false, true] {
        let mut s = with(Route::Chat, |o| {
            o.strip_reasoning = true;
            o.expose_token_ids = expose;
        });
        let body = [
            sse(&[ROLE, REASONING, IDS_ONLY, CONTENT_LP, FINISH]),
            b"data: [DONE]\n\n".to_vec(),
        ]
        .concat();
        let (out, n, state) = s.feed(&body);
        let prompt = if expose { "[1,2]" } else { "null" };
        let want = format!(
            concat!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}}}}],\"prompt_token_ids\":{}}}\n\n",
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}},\"logprobs\":null,\"token_ids\":null}}]}}\n\n",
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"length\",\"token_ids\":null}}]}}\n\n",
                "data: [DONE]\n\n"
            ),
            prompt
        );
        assert_eq!(std::str::from_utf8(out).unwrap(), want);
        assert_eq!((n, state, s.output_tokens()), (5, State::Done, 5));
    }
    // The IDs are still required and validated.
    let mut s = with(Route::Chat, |o| o.strip_reasoning = true);
    s.feed(&sse(&[
        r#"{"choices":[{"index":0,"delta":{"reasoning":"x"}}]}"#,
    ]));
    assert!(s.failure().unwrap().to_string().contains("no token_ids"));
}

#[test]
fn chat_echo_chunk_is_prompt_not_output() {
    let echo = r#"{"choices":[{"index":0,"delta":{"content":"Once upon"},"logprobs":null,"finish_reason":null}]}"#;
    let body = [sse(&[ROLE, echo, TEXT]), b"data: [DONE]\n\n".to_vec()].concat();
    let mut s = with(Route::Chat, |o| {
        o.echo = true;
        o.expose_token_ids = true;
    });
    let (out, n, state) = s.feed(&body);
    assert_eq!(out, body.clone().replace_crlf());
    assert_eq!((n, state, s.output_tokens()), (2, State::Done, 2));
    // Only before generated output: a later event without IDs still fails.
    let mut s = with(Route::Chat, |o| o.echo = true);
    s.feed(&sse(&[ROLE, echo, TEXT, echo]));
    assert!(s.failure().unwrap().to_string().contains("no token_ids"));
    // Without echo asked, the same event is generated output without IDs.
    let mut s = with(Route::Chat, |_| {});
    s.feed(&sse(&[ROLE, echo]));
    assert!(s.failure().is_some());
    // Without required IDs it is not counted as an event carrying output either.
    let mut s = with(Route::Chat, |o| {
        o.echo = true;
        o.require_token_ids = false;
    });
    assert_eq!(s.feed(&sse(&[ROLE, echo, TEXT])).1, 1);
}

#[test]
fn completion_echo_keeps_the_prompt_ids_vllm_sends() {
    let first = r#"{"choices":[{"index":0,"text":"Say hi there","prompt_token_ids":[1,2],"token_ids":null}]}"#;
    let mut s = with(Route::Completion, |o| {
        o.echo = true;
        o.require_token_ids = false;
    });
    let (out, n, _) = s.feed(&sse(&[first]));
    assert_eq!(out, sse(&[first]).replace_crlf());
    assert_eq!(n, 1);
    let mut s = with(Route::Completion, |o| o.require_token_ids = false);
    let (out, _, _) = s.feed(&sse(&[first]));
    assert!(std::str::from_utf8(out)
        .unwrap()
        .contains(r#""prompt_token_ids":null"#));
}

#[test]
fn assembly_with_strip_and_echo() {
    let head = r#""id":"c","object":"chat.completion.chunk","created":1,"model":"m""#;
    let role = format!(
        r#"{{{head},"choices":[{{"index":0,"delta":{{"role":"user","content":""}}}}],"prompt_token_ids":[1]}}"#
    );
    let echo = format!(
        r#"{{{head},"choices":[{{"index":0,"delta":{{"content":"pre "}},"logprobs":null,"finish_reason":null}}]}}"#
    );
    let body = [
        sse(&[&role, &echo, REASONING, CONTENT_LP, FINISH]),
        b"data: [DONE]\n\n".to_vec(),
    ]
    .concat();
    let mut s = with(Route::Chat, |o| {
        o.assemble = true;
        o.expose_token_ids = true;
        o.strip_reasoning = true;
        o.echo = true;
    });
    assert_eq!(s.feed(&body).2, State::Done);
    let out: serde_json::Value = serde_json::from_slice(&s.finish().unwrap()).unwrap();
    let choice = &out["choices"][0];
    assert_eq!(choice["message"]["role"], "user");
    assert_eq!(choice["message"]["content"], "pre hi");
    assert!(choice["message"]["reasoning"].is_null());
    assert!(choice["logprobs"].is_null() && choice["token_ids"].is_null());
    assert_eq!(out["prompt_token_ids"], serde_json::json!([1]));
    assert_eq!(out["usage"]["completion_tokens"], 4);
    // Echo asked but nothing to echo and no content: vLLM still answers a string.
    let calls = format!(
        r#"{{{head},"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"t","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}]}},"token_ids":[3]}}]}}"#
    );
    let mut s = with(Route::Chat, |o| {
        o.assemble = true;
        o.echo = true;
    });
    s.feed(&[sse(&[&role, &calls]), b"data: [DONE]\n\n".to_vec()].concat());
    let out: serde_json::Value = serde_json::from_slice(&s.finish().unwrap()).unwrap();
    assert_eq!(out["choices"][0]["message"]["content"], "");
}

#[test]
fn dropped_usage_leaves_its_fingerprint_on_the_held_finish_event() {
    let finish = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","token_ids":[2]}]}"#;
    let usage = r#"{"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"fp"}"#;
    let mut s = session(false, false, true);
    let (out, _, _) = s.feed(&sse(&[TEXT, finish]));
    assert!(!std::str::from_utf8(out).unwrap().contains("finish_reason")); // it waits
    let (out, _, state) = s.feed(&[sse(&[usage]), b"data: [DONE]\n\n".to_vec()].concat());
    assert_eq!(
        std::str::from_utf8(out).unwrap(),
        concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\",",
            "\"token_ids\":null}],\"system_fingerprint\":\"fp\"}\n\ndata: [DONE]\n\n"
        )
    );
    assert_eq!(state, State::Done);
    let mut s = session(false, false, true);
    s.feed(&sse(&[finish]));
    let (out, _, state) = s.feed(b"data: {x\n\n");
    assert!(out.starts_with(b"data: {\"choices\"") && state == State::Failed);
}

#[test]
fn the_engines_prompt_count_comes_from_its_ids_then_its_usage() {
    let mut s = session(false, false, true);
    assert_eq!(s.engine_prompt_tokens(), None);
    s.feed(format!("data: {ROLE}\n\n").as_bytes());
    assert_eq!(s.engine_prompt_tokens(), Some(2));
    let usage = r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":0}}"#;
    s.feed(format!("data: {usage}\n\n").as_bytes());
    assert_eq!(
        s.engine_prompt_tokens(),
        Some(7),
        "usage covers every prompt"
    );
    assert_eq!(s.engine_cached_tokens(), None);
    let usage = r#"{"choices":[],"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}"#;
    s.feed(format!("data: {usage}\n\n").as_bytes());
    assert_eq!(s.engine_cached_tokens(), Some(32));
}

const HEAD_ROLE: &str = r#"{"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2]}"#;
const HEAD_TEXT: &str = r#"{"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,"finish_reason":null,"token_ids":[7,8]}]}"#;
const CONT_FIRST: &str = r#"{"id":"cmpl-b","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":" there","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2,7,8],"token_ids":[9]}]}"#;
const CONT_LAST: &str = r#"{"id":"cmpl-b","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[2]}],"system_fingerprint":"fp"}"#;
const CONT_USAGE: &str = r#"{"id":"cmpl-b","object":"text_completion","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}"#;

fn resumable(assemble: bool, expose: bool) -> StreamSession {
    resumable_on(Route::Chat, assemble, expose)
}

fn resumable_on(route: Route, assemble: bool, expose: bool) -> StreamSession {
    let mut s = StreamSession::new(Options {
        route,
        assemble,
        expose_token_ids: expose,
        drop_usage: false,
        require_token_ids: true,
        prompt_tokens: 0,
        strip_reasoning: false,
        echo: false,
    });
    s.enable_resume();
    s
}

#[test]
fn resume_continues_a_chat_stream_in_its_own_shape() {
    let mut s = resumable(false, true);
    s.feed(&sse(&[HEAD_ROLE, HEAD_TEXT]));
    // a partial event when the connection broke: not counted, not resumed from
    s.feed(b"data: {\"choices\":[{\"ind");
    assert_eq!(s.resume_point(), Some((b"[1,2,7,8]".to_vec(), 2)));
    assert!(s.resume());
    let body = [
        sse(&[CONT_FIRST, CONT_LAST, CONT_USAGE]),
        b"data: [DONE]\n\n".to_vec(),
    ]
    .concat();
    let (out, n, state) = s.feed(&body);
    let text = String::from_utf8(out.to_vec()).unwrap();
    assert_eq!(state, State::Done);
    assert_eq!(n, 2);
    let want = concat!(
        "data: {\"id\":\"chatcmpl-a\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[9]}]}\n\n",
        "data: {\"id\":\"chatcmpl-a\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null,\"token_ids\":[2]}],\"system_fingerprint\":\"fp\"}\n\n",
        "data: {\"id\":\"chatcmpl-a\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"total_tokens\":6,\"completion_tokens\":4}}\n\n",
        "data: [DONE]\n\n",
    );
    assert_eq!(text, want);
    assert_eq!(s.output_tokens(), 4);
    assert_eq!(s.resume_point(), None); // finished
}

#[test]
fn resume_assembles_the_whole_answer() {
    let mut s = resumable(true, true);
    s.feed(&sse(&[HEAD_ROLE, HEAD_TEXT]));
    assert!(s.resume());
    s.feed(
        &[
            sse(&[CONT_FIRST, CONT_LAST, CONT_USAGE]),
            b"data: [DONE]\n\n".to_vec(),
        ]
        .concat(),
    );
    let body: serde_json::Value = serde_json::from_slice(&s.finish().unwrap()).unwrap();
    assert_eq!(body["id"], "chatcmpl-a");
    assert_eq!(body["choices"][0]["message"]["content"], "hi there");
    assert_eq!(
        body["choices"][0]["token_ids"],
        serde_json::json!([7, 8, 9, 2])
    );
    assert_eq!(body["usage"]["prompt_tokens"], 2);
    assert_eq!(body["usage"]["completion_tokens"], 4);
}

#[test]
fn an_error_event_is_held_back_while_the_answer_can_resume() {
    let mut s = resumable(false, false);
    s.feed(&sse(&[HEAD_ROLE, HEAD_TEXT]));
    let (out, _, state) = s.feed(&sse(&[r#"{"error":{"message":"boom","code":500}}"#]));
    assert!(out.is_empty());
    assert_eq!(state, State::Failed);
    assert_eq!(s.failure().map(StreamError::code), Some("engine_error"));
    assert!(s.engine_error().is_some());
    assert!(s.resume());
    assert!(s.engine_error().is_none());
}

#[test]
fn structure_or_a_finish_makes_the_answer_unresumable() {
    let tool = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]},"token_ids":[5]}]}"#;
    let reasoning = r#"{"choices":[{"index":0,"delta":{"reasoning":"hm"},"token_ids":[5]}]}"#;
    let finish = r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length","token_ids":[5]}]}"#;
    for ev in [tool, reasoning, finish] {
        let mut s = resumable(false, false);
        s.feed(&sse(&[HEAD_ROLE, HEAD_TEXT, ev]));
        assert_eq!(s.resume_point(), None, "{ev}");
        assert!(!s.resume());
        // an error event now goes out as it did before
        let (out, _, state) = s.feed(&sse(&[r#"{"error":{"message":"boom"}}"#]));
        assert!(!out.is_empty() && state == State::Open);
    }
    // without enable_resume nothing is kept
    let mut s = session(false, false, true);
    s.feed(&sse(&[HEAD_ROLE, HEAD_TEXT]));
    assert_eq!(s.resume_point(), None);
}

#[test]
fn resume_continues_a_completion_stream_with_every_field() {
    // vLLM's completion chunks carry every field (`prompt_token_ids` and `usage` null after
    // the first chunk): the continuation's chunks come out the same way.
    let first = r#"{"id":"cmpl-a","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2],"token_ids":[7,8]}],"usage":null}"#;
    let mut s = resumable_on(Route::Completion, false, true);
    s.feed(&sse(&[first]));
    assert_eq!(s.resume_point(), Some((b"[1,2,7,8]".to_vec(), 2)));
    assert!(s.resume());
    let (out, n, state) =
        s.feed(&[sse(&[CONT_LAST, CONT_USAGE]), b"data: [DONE]\n\n".to_vec()].concat());
    let want = concat!(
        "data: {\"id\":\"cmpl-a\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":[2]}],\"usage\":null,\"system_fingerprint\":\"fp\"}\n\n",
        "data: {\"id\":\"cmpl-a\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"total_tokens\":6,\"completion_tokens\":4}}\n\n",
        "data: [DONE]\n\n",
    );
    assert_eq!(String::from_utf8(out.to_vec()).unwrap(), want);
    assert_eq!((n, state), (1, State::Done));
}

#[test]
fn a_stream_failed_on_bad_output_cannot_resume() {
    // The IDs of the failing event are not part of the answer: no resume point that would
    // count them in the prompt but not in the number generated.
    let bad_usage = r#"{"choices":[{"index":0,"delta":{"content":"x"},"token_ids":[5]}],"usage":{"completion_tokens":"3"}}"#;
    let mut s = resumable(false, false);
    s.feed(&sse(&[HEAD_ROLE, HEAD_TEXT, bad_usage]));
    assert_eq!(
        s.failure().map(StreamError::code),
        Some("malformed_engine_output")
    );
    assert_eq!(s.resume_point(), None);
    assert!(!s.resume());
}

fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut wire = Vec::new();
    let mut rest = body;
    let mut k = 0;
    while !rest.is_empty() {
        let n = sizes[k % sizes.len()].min(rest.len());
        wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        wire.extend_from_slice(&rest[..n]);
        wire.extend_from_slice(b"\r\n");
        rest = &rest[n..];
        k += 1;
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    wire
}

#[test]
fn pump_writes_what_feed_returns_framed_at_every_split() {
    let body = [
        sse(&[ROLE, TEXT, IDS_ONLY]),
        b"data: [DONE]\r\n\r\n".to_vec(),
    ]
    .concat();
    let (want, want_n, _) = {
        let mut s = session(false, false, true);
        let (out, n, st) = s.feed(&body);
        (out.to_vec(), n, st)
    };
    let wire = chunked(&body, &[7, 40, 3]);
    for cut in 0..=wire.len() {
        let mut s = session(false, false, true);
        s.start_pump();
        s.watch_tokens = true;
        let mut client = Vec::new();
        let mut tokens = 0;
        let mut flags = 0;
        for read in [&wire[..cut], &wire[cut..]] {
            let p = s.pump(read);
            client.extend_from_slice(p.write);
            tokens += p.tokens;
            flags |= p.flags;
            if p.flags & pump_flags::STATE != 0 {
                let (out, n, st) = s.last_read();
                assert_eq!(st, State::Done);
                frame_chunk(&mut client, out);
                tokens += n;
            }
        }
        let mut framed = Vec::new();
        // the client saw the same bytes, however the reads were cut
        let mut decoded = ChunkedDecoder::new();
        decoded
            .feed(&client, &mut |p: &[u8]| framed.extend_from_slice(p))
            .unwrap();
        assert_eq!(framed, want, "cut at {cut}");
        assert_eq!(tokens, want_n);
        assert_eq!(
            flags & !pump_flags::TOKENS,
            pump_flags::STATE | pump_flags::BODY_ENDED
        );
    }
}

#[test]
fn pump_reports_bad_framing_and_bytes_after_the_end() {
    let mut s = session(false, true, true);
    s.start_pump();
    let p = s.pump(b"5\r\nhelloX");
    assert_eq!(p.flags, pump_flags::MALFORMED);
    assert_eq!(s.framing_error(), Some(&ChunkError::DataEnd));
    let mut s = session(false, true, true);
    s.start_pump();
    let p = s.pump(b"0\r\n\r\nHTTP/1.1");
    assert_eq!(p.flags, pump_flags::MALFORMED | pump_flags::BODY_ENDED);
}
