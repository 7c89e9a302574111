//! Seed streams: real vLLM captures from the repository's transcripts, and synthetic streams
//! that reach every assembly row (reasoning, refusal, tool calls, function_call, logprobs,
//! usage, error events, ID-only events, multi-line data, CRLF framing, comments).

use std::fs;
use std::path::Path;

/// Streams found in transcript files: each run of `data:` lines (with the blank lines
/// between events) becomes one seed.
pub fn from_transcripts(dir: &Path) -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return seeds;
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let mut current = Vec::new();
        for line in text.lines() {
            if line.starts_with("data: ") {
                current.extend_from_slice(line.as_bytes());
                current.extend_from_slice(b"\n\n");
            } else if !line.is_empty() && !current.is_empty() {
                seeds.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            seeds.push(current);
        }
    }
    seeds
}

const CHAT_HEAD: &str =
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":["#;
const CMPL_HEAD: &str =
    r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":["#;

fn chat(choice: &str) -> String {
    format!("data: {CHAT_HEAD}{choice}]}}\n\n")
}

fn cmpl(choice: &str) -> String {
    format!("data: {CMPL_HEAD}{choice}],\"usage\":null}}\n\n")
}

fn delta(d: &str, ids: &str) -> String {
    chat(&format!(
        r#"{{"index":0,"delta":{d},"logprobs":null,"finish_reason":null,"token_ids":{ids}}}"#
    ))
}

/// Synthetic streams (chat and completion) in vLLM 0.32's shapes.
pub fn synthetic() -> Vec<Vec<u8>> {
    let role = chat(
        r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3"#,
    );
    let finish = chat(
        r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[]}"#,
    );
    let usage = format!(
        "data: {CHAT_HEAD}],\"usage\":{{\"prompt_tokens\":3,\"total_tokens\":5,\"completion_tokens\":2}}}}\n\n"
    );
    let done = "data: [DONE]\n\n";
    let mut out: Vec<String> = Vec::new();
    for key in ["content", "reasoning", "reasoning_content", "refusal"] {
        out.push(format!(
            "{role}{}{}{finish}{usage}{done}",
            delta(&format!(r#"{{"{key}":"Hel"}}"#), "[10]"),
            delta(&format!(r#"{{"{key}":"lo é\u00e9 😀"}}"#), "[11,12]"),
        ));
    }
    let tool = |i: u32, body: &str| {
        delta(
            &format!(r#"{{"tool_calls":[{{"index":{i},{body}}}]}}"#),
            "[20]",
        )
    };
    out.push(format!(
        "{role}{}{}{}{}{}{finish}{done}",
        tool(
            0,
            r#""id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}"#
        ),
        tool(0, r#""function":{"arguments":"{\"loc"}"#),
        tool(
            1,
            r#""id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}"#
        ),
        tool(0, r#""function":{"arguments":"\": \"Oslo\"}"}"#),
        delta("{}", "[21]"),
    ));
    out.push(format!(
        "{role}{}{}{finish}{done}",
        delta(
            r#"{"function_call":{"name":"f","arguments":"{\"a\""}}"#,
            "[30]"
        ),
        delta(r#"{"function_call":{"arguments":":1}"}}"#, "[31]"),
    ));
    let lp = r#"{"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.5,"bytes":[72,105]}]}],"refusal":null}"#;
    out.push(format!(
        "{role}{}{finish}{done}",
        chat(&format!(
            r#"{{"index":0,"delta":{{"content":"Hi"}},"logprobs":{lp},"finish_reason":null,"token_ids":[40]}}"#
        )),
    ));
    let clp =
        r#"{"text_offset":[0],"token_logprobs":[-0.1],"tokens":["a"],"top_logprobs":[{"a":-0.1}]}"#;
    let ctext = |t: &str, ids: &str, fin: &str| {
        cmpl(&format!(
            r#"{{"index":0,"text":"{t}","logprobs":{clp},"finish_reason":{fin},"stop_reason":null,"prompt_token_ids":null,"token_ids":{ids}}}"#
        ))
    };
    out.push(format!(
        "{}{}{}{done}",
        ctext("a", "[1]", "null"),
        ctext(" b", "[2,3]", "null"),
        ctext("", "[]", "\"length\""),
    ));
    out.push(format!(
        "{role}{}data: {{\"error\": {{\"message\": \"boom\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}}}\n\n{done}",
        delta(r#"{"content":"x"}"#, "[5]"),
    ));
    // framing variants: CRLF, CR, comments, other fields, multi-line data
    let plain = format!("{role}{}{finish}{done}", delta(r#"{"content":"y"}"#, "[6]"));
    out.push(plain.replace('\n', "\r\n"));
    out.push(plain.replace('\n', "\r"));
    out.push(format!(
        ": keep-alive\n\nevent: x\nid: 1\nretry: 5\n{plain}"
    ));
    out.push(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\ndata: \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"z\"}},\"token_ids\":[7]}}]}}\n\n{done}"
    ));
    // ID-only events (tool-call markup tokens) between text
    out.push(format!(
        "{role}{}{}{}{finish}{done}",
        delta("{}", "[50]"),
        delta(r#"{"content":"q"}"#, "[51]"),
        delta("{}", "[52,53]"),
    ));
    out.into_iter().map(String::into_bytes).collect()
}
