//! Resuming a broken answer on another engine (migration): what a session keeps for it while
//! it reads the first engine, and the rewriting of the continuation engine's completion
//! chunks into the original stream's shape (same `id`, `created`, `model`, choice index;
//! chat chunks stay chat chunks), so that the rest of the session (ID validation, exposure,
//! assembly, counting) reads them like the first engine's events.
//!
//! Only a session asked to (`StreamSession::enable_resume`) keeps any of this; without it the
//! per-token path is unchanged.

use crate::delta::{parse_usage, Event};
use crate::error::StreamError;
use crate::token_ids::IdList;

/// The first event's identity, as raw JSON, for every rewritten event.
#[derive(Debug)]
struct Head {
    id: Vec<u8>,
    created: Vec<u8>,
    model: Vec<u8>,
    index: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct Resume {
    /// Every output so far is plain generated text (no reasoning, refusal or call, no
    /// finish, no logprobs, one choice): a token-ID continuation reproduces what follows.
    safe: bool,
    /// The prompt's IDs (between the brackets of the first `prompt_token_ids` seen).
    prompt: Option<Vec<u8>>,
    prompt_count: u64,
    /// The generated IDs so far, comma-joined.
    generated: Vec<u8>,
    head: Option<Head>,
    /// Reading a continuation: events are rewritten before they are processed.
    pub(crate) continuing: bool,
    /// Validated IDs generated before the current continuation.
    base: u64,
    /// The rewritten event (reused).
    pub(crate) scratch: Vec<u8>,
}

fn raw_or_null(r: Option<&serde_json::value::RawValue>) -> Vec<u8> {
    r.map_or_else(|| b"null".to_vec(), |r| r.get().as_bytes().to_vec())
}

impl Resume {
    pub(crate) fn new() -> Self {
        Resume {
            safe: true,
            prompt: None,
            prompt_count: 0,
            generated: Vec::new(),
            head: None,
            continuing: false,
            base: 0,
            scratch: Vec::new(),
        }
    }

    /// A prompt ID list of the event (the first one is the prompt).
    pub(crate) fn note_prompt(&mut self, list: IdList<'_>) {
        if self.prompt.is_none() && !self.continuing {
            self.prompt = Some(list.inner.to_vec());
            self.prompt_count = list.count;
        }
    }

    /// A generated ID list of the event.
    pub(crate) fn note_ids(&mut self, list: IdList<'_>) {
        if list.inner.is_empty() {
            return;
        }
        if !self.generated.is_empty() {
            self.generated.push(b',');
        }
        self.generated.extend_from_slice(list.inner);
    }

    /// An accepted (non-error) event: keep the first event's identity, and judge whether the
    /// answer is still plain generated text.
    pub(crate) fn observe(&mut self, ev: &Event<'_>) {
        if self.head.is_none() {
            let first = ev.choices.iter().flatten().next();
            if first.is_none() {
                return;
            }
            self.head = Some(Head {
                id: raw_or_null(ev.id),
                created: raw_or_null(ev.created),
                model: raw_or_null(ev.model),
                index: raw_or_null(first.and_then(|c| c.index)),
            });
        }
        let Some(head) = &self.head else { return };
        for c in ev.choices.iter().flatten() {
            let same = c.index.map(|r| r.get().as_bytes()) == Some(head.index.as_slice())
                || (c.index.is_none() && head.index == b"null");
            let plain_delta = c.delta.as_ref().is_none_or(|d| {
                d.reasoning.is_none()
                    && d.reasoning_content.is_none()
                    && d.refusal.is_none()
                    && d.tool_calls.is_none()
                    && d.function_call.is_none()
                    && d.unknown.is_none()
            });
            if !same
                || !plain_delta
                || c.finish_reason.is_some()
                || c.logprobs.is_some()
                || c.unknown.is_some()
            {
                self.safe = false;
            }
        }
    }

    /// The answer can continue on another engine from here.
    pub(crate) fn ready(&self) -> bool {
        self.safe && self.prompt.is_some() && self.head.is_some()
    }

    /// The continuation's token-ID prompt: the prompt's IDs, then the generated ones.
    pub(crate) fn prompt_json(&self) -> Option<Vec<u8>> {
        let prompt = self.prompt.as_ref()?;
        let mut out = Vec::with_capacity(prompt.len() + self.generated.len() + 3);
        out.push(b'[');
        out.extend_from_slice(prompt);
        if !self.generated.is_empty() {
            if !prompt.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(&self.generated);
        }
        out.push(b']');
        Some(out)
    }

    /// Start reading a continuation, `generated` IDs into the answer.
    pub(crate) fn begin(&mut self, generated: u64) {
        self.continuing = true;
        self.base = generated;
    }

    /// Rewrite one continuation event (a completion chunk) into `out` in the original
    /// stream's shape: chat chunks as vLLM's chat serving writes them (`stop_reason` on the
    /// finish chunk only), completion chunks with every field as vLLM's completion serving
    /// writes them (`prompt_token_ids` and `usage` null). `chat`: the original is a chat
    /// stream. A usage frame's usage counts the original prompt once and sums the completion
    /// tokens of every engine.
    pub(crate) fn rewrite(
        &self,
        ev: &Event<'_>,
        chat: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), StreamError> {
        let prompt_tokens = self.prompt_count;
        let head = self
            .head
            .as_ref()
            .ok_or_else(|| StreamError::malformed("continuation before the first event"))?;
        out.clear();
        out.extend_from_slice(b"{\"id\":");
        out.extend_from_slice(&head.id);
        out.extend_from_slice(if chat {
            b",\"object\":\"chat.completion.chunk\",\"created\":"
        } else {
            b",\"object\":\"text_completion\",\"created\":"
        });
        out.extend_from_slice(&head.created);
        out.extend_from_slice(b",\"model\":");
        out.extend_from_slice(&head.model);
        out.extend_from_slice(b",\"choices\":[");
        for (i, c) in ev.choices.iter().flatten().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"index\":");
            out.extend_from_slice(&head.index);
            let text = c.text.map_or(&b"\"\""[..], |r| r.get().as_bytes());
            if chat {
                out.extend_from_slice(b",\"delta\":{\"content\":");
                out.extend_from_slice(text);
                out.push(b'}');
            } else {
                out.extend_from_slice(b",\"text\":");
                out.extend_from_slice(text);
            }
            out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
            out.extend_from_slice(&raw_or_null(c.finish_reason));
            if !chat || c.finish_reason.is_some() {
                out.extend_from_slice(b",\"stop_reason\":");
                out.extend_from_slice(&raw_or_null(c.stop_reason));
            }
            if !chat {
                // vLLM's completion chunks carry every field of the choice; the
                // continuation's prompt IDs are not the client's prompt.
                out.extend_from_slice(b",\"prompt_token_ids\":null,\"token_ids\":");
                out.extend_from_slice(&raw_or_null(c.token_ids));
            } else if let Some(ids) = c.token_ids {
                out.extend_from_slice(b",\"token_ids\":");
                out.extend_from_slice(ids.get().as_bytes());
            }
            out.push(b'}');
        }
        out.push(b']');
        let usage_frame = ev.usage.filter(|_| ev.is_usage_only());
        if usage_frame.is_none() && !chat {
            out.extend_from_slice(b",\"usage\":null");
        }
        if let Some(raw) = usage_frame {
            let usage = parse_usage(raw)?;
            let completion = self.base + usage.completion_tokens.unwrap_or(0);
            out.extend_from_slice(
                format!(
                    ",\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"total_tokens\":{},\"completion_tokens\":{completion}}}",
                    prompt_tokens + completion
                )
                .as_bytes(),
            );
        }
        if let Some(fp) = ev.system_fingerprint {
            out.extend_from_slice(b",\"system_fingerprint\":");
            out.extend_from_slice(fp.get().as_bytes());
        }
        out.push(b'}');
        Ok(())
    }
}
