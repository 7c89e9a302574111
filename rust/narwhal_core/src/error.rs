//! Typed errors of the stream core: what can go wrong with an engine stream, and its code.

use thiserror::Error;

/// Why an engine stream (or its assembly) failed. `code()` is the public error code the
/// router puts in its envelope (SPEC §12).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StreamError {
    /// The engine sent bytes that are not a well-formed stream of supported events.
    #[error("{0}")]
    Malformed(String),
    /// The engine sent a field with a value the non-streaming assembler cannot represent.
    #[error("{0}")]
    Unsupported(String),
    /// The engine reported an error event; the message is the engine's own.
    #[error("{0}")]
    Engine(String),
    /// `finish()` was called on a session that does not assemble.
    #[error("finish() is only available in assemble mode")]
    NotAssembling,
}

impl StreamError {
    /// The public error code (`error.code` in the router's envelope).
    pub fn code(&self) -> &'static str {
        match self {
            StreamError::Malformed(_) => "malformed_engine_output",
            StreamError::Unsupported(_) => "unsupported_engine_field",
            StreamError::Engine(_) => "engine_error",
            StreamError::NotAssembling => "not_assembling",
        }
    }

    /// Shorthand for a `Malformed` error.
    pub fn malformed(msg: impl Into<String>) -> Self {
        StreamError::Malformed(msg.into())
    }

    /// Shorthand for an `Unsupported` error.
    pub fn unsupported(msg: impl Into<String>) -> Self {
        StreamError::Unsupported(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_public_ones() {
        assert_eq!(
            StreamError::malformed("x").code(),
            "malformed_engine_output"
        );
        assert_eq!(
            StreamError::unsupported("x").code(),
            "unsupported_engine_field"
        );
        assert_eq!(StreamError::Engine("x".into()).code(), "engine_error");
        assert_eq!(StreamError::malformed("bad ids").to_string(), "bad ids");
    }
}
