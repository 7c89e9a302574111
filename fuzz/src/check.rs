//! One fuzz input through `StreamSession` in one mode, with oracles: no panic, the same
//! outcome whatever the read boundaries, well-framed SSE whose payloads are JSON, a valid
//! JSON body from `finish`, and nothing more once the stream is done or failed.

use narwhal_core::session::{Options, Route, State, StreamSession};
use serde::de::IgnoredAny; // JSON syntax only: 1e400 is valid JSON an engine may send

use crate::rng::Rng;

/// What a session made of a whole input.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub out: Vec<u8>,
    pub tokens: u64,
    pub state: u8,
    pub failure: Option<String>,
    pub output_tokens: u64,
    pub finish: Option<Result<Vec<u8>, String>>,
}

/// Every combination of the session's options (128 modes).
pub fn all_modes() -> Vec<Options> {
    let mut modes = Vec::new();
    for bits in 0..128u32 {
        modes.push(Options {
            route: if bits & 1 == 0 {
                Route::Chat
            } else {
                Route::Completion
            },
            assemble: bits & 2 != 0,
            expose_token_ids: bits & 4 != 0,
            drop_usage: bits & 8 != 0,
            require_token_ids: bits & 16 != 0,
            prompt_tokens: 5,
            strip_reasoning: bits & 32 != 0,
            echo: bits & 64 != 0,
        });
    }
    modes
}

/// Feed `input` in the reads `cuts` describes (ascending offsets), then finish.
pub fn run(opts: Options, input: &[u8], cuts: &[usize]) -> Result<Outcome, String> {
    let mut session = StreamSession::new(opts);
    let mut out = Vec::new();
    let mut tokens = 0;
    let mut at = 0;
    let mut ended = false;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let (bytes, n, state) = session.feed(&input[at..cut]);
        if ended && (!bytes.is_empty() || n != 0) {
            return Err("output after the stream ended".into());
        }
        out.extend_from_slice(bytes);
        tokens += n;
        ended = state != State::Open;
        at = cut;
    }
    let state = session.state();
    let finish = opts
        .assemble
        .then(|| session.finish().map_err(|e| e.code().to_string()));
    Ok(Outcome {
        out,
        tokens,
        state: state as u8,
        failure: session.failure().map(|e| format!("{}: {e}", e.code())),
        output_tokens: session.output_tokens(),
        finish,
    })
}

/// Random read boundaries for `len` bytes.
pub fn random_cuts(rng: &mut Rng, len: usize) -> Vec<usize> {
    if len < 2 {
        return Vec::new();
    }
    let mut cuts: Vec<usize> = match rng.below(3) {
        0 => (1..len).collect(), // one byte per read
        _ => (0..1 + rng.below(12))
            .map(|_| 1 + rng.below(len - 1))
            .collect(),
    };
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Check one input in one mode: the state it ended in (0 open, 1 done, 2 failed, 3 done
/// and assembled), or `Err` naming the broken property.
pub fn check(rng: &mut Rng, opts: Options, input: &[u8]) -> Result<usize, String> {
    let whole = run(opts, input, &[])?;
    let cuts = random_cuts(rng, input.len());
    let split = run(opts, input, &cuts)?;
    if whole != split {
        return Err(format!("read boundaries changed the outcome (cuts {cuts:?}):\n  whole {whole:?}\n  split {split:?}"));
    }
    if opts.assemble {
        if !whole.out.is_empty() {
            return Err("assemble mode wrote to the client".into());
        }
        if let Some(Ok(body)) = &whole.finish {
            serde_json::from_slice::<IgnoredAny>(body)
                .map_err(|e| format!("finish() body is not JSON ({e}): {}", lossy(body)))?;
        }
    } else {
        check_sse(&whole.out)?;
    }
    if whole.state == State::Done as u8 && whole.failure.is_some() {
        return Err("done and failed at once".into());
    }
    Ok(match whole.finish {
        Some(Ok(_)) => 3,
        _ => whole.state as usize,
    })
}

/// The client-side bytes must be `data:` events whose payloads are JSON or `[DONE]`.
fn check_sse(out: &[u8]) -> Result<(), String> {
    if out.is_empty() {
        return Ok(());
    }
    if !out.ends_with(b"\n\n") {
        return Err(format!("output does not end an event: {}", lossy(out)));
    }
    let text =
        std::str::from_utf8(out).map_err(|_| format!("output is not UTF-8: {}", lossy(out)))?;
    for event in text.strip_suffix("\n\n").unwrap_or(text).split("\n\n") {
        let mut data = String::new();
        for line in event.split('\n') {
            let payload = line
                .strip_prefix("data: ")
                .ok_or_else(|| format!("output line is not a data field: {line:?}"))?;
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(payload);
        }
        if data != "[DONE]" {
            serde_json::from_str::<IgnoredAny>(&data)
                .map_err(|e| format!("output event is not JSON ({e}): {data:?}"))?;
        }
    }
    Ok(())
}

pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(600)]).into_owned()
}
