//! The accounting vocabulary: terminal classes, their reasons (SPEC §12 error codes), phases, and how a request ended.

use thiserror::Error;

/// A name the board does not know.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NameError {
    #[error("unknown terminal class {0:?}")]
    UnknownClass(String),
    #[error("unknown reason {0:?}")]
    UnknownReason(String),
    #[error("terminal class {0:?} needs a reason")]
    MissingReason(&'static str),
    #[error("terminal class {0:?} takes no reason")]
    UnexpectedReason(&'static str),
    #[error("unknown histogram {0:?}")]
    UnknownHistogram(String),
    #[error("unknown phase {0:?} (prefill or decode)")]
    UnknownPhase(String),
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            pub fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }
    };
}

named_enum!(
    /// The `reason` label of a terminal class: SPEC §12's error codes plus `engine_rejected`.
    Reason {
        InvalidJson => "invalid_json",
        InvalidRequest => "invalid_request",
        ModelNotFound => "model_not_found",
        InvalidSamplingWidth => "invalid_sampling_width",
        UnsupportedOption => "unsupported_option",
        RequestTooLarge => "request_too_large",
        RetentionFull => "retention_full",
        QueueFull => "queue_full",
        AdmissionWaitExpired => "admission_wait_expired",
        DeadlineExpired => "deadline_expired",
        TtftBudgetExceeded => "ttft_budget_exceeded",
        PromptExceedsTtftBudget => "prompt_exceeds_ttft_budget",
        BackendUnavailable => "backend_unavailable",
        RouterStandby => "router_standby",
        RouterFenced => "router_fenced",
        Maintenance => "maintenance",
        MonitoringDegraded => "monitoring_degraded",
        EngineError => "engine_error",
        UnsupportedEngineField => "unsupported_engine_field",
        MalformedEngineOutput => "malformed_engine_output",
        EngineRejected => "engine_rejected",
    }
);

named_enum!(
    /// Terminal classes counted by reason.
    Class {
        Rejected => "rejected",
        Refused => "refused",
        InvalidRequests => "invalid_requests",
        Expired => "expired",
        Failed => "failed",
    }
);

named_enum!(
    /// A request's phase on an engine.
    Phase {
        Prefill => "prefill",
        Decode => "decode",
    }
);

pub(crate) const N_REASONS: usize = 21;
pub(crate) const N_CLASSES: usize = 5;
const _: () = assert!(Reason::ALL.len() == N_REASONS && Class::ALL.len() == N_CLASSES);

/// How a request ended: a class with a reason, or `cancelled` / `completed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminal {
    WithReason(Class, Reason),
    Cancelled,
    Completed,
}

impl Terminal {
    /// Parses a class name and optional reason (`cancelled`/`completed` take none, the
    /// other classes need one).
    pub fn parse(class: &str, reason: Option<&str>) -> Result<Terminal, NameError> {
        let bare = match class {
            "cancelled" => Some(Terminal::Cancelled),
            "completed" => Some(Terminal::Completed),
            _ => None,
        };
        if let Some(terminal) = bare {
            return match reason {
                None => Ok(terminal),
                Some(_) => Err(NameError::UnexpectedReason(terminal.class_name())),
            };
        }
        let class = Class::parse(class).ok_or_else(|| NameError::UnknownClass(class.into()))?;
        let reason = reason.ok_or(NameError::MissingReason(class.as_str()))?;
        let reason =
            Reason::parse(reason).ok_or_else(|| NameError::UnknownReason(reason.into()))?;
        Ok(Terminal::WithReason(class, reason))
    }

    pub fn class_name(self) -> &'static str {
        match self {
            Terminal::WithReason(class, _) => class.as_str(),
            Terminal::Cancelled => "cancelled",
            Terminal::Completed => "completed",
        }
    }
}
