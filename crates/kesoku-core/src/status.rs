//! The three axes of a message (role, type, status) and the one table of legal status changes.
//!
//! The transition table is the state machine of the whole system: every status change anywhere
//! (store, gateway, adapters, workers) is checked against [`Status::can_transition_to`]. It is not
//! a place for policy about *who* may make a change; that lives with the callers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Who authored a message (spec 2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    Tool,
    System,
}

/// The structural kind of a message (spec 2.2). Serialized as the `type` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageType {
    Text,
    Thought,
    ToolCall,
    ToolResult,
}

/// Where a message is in the pipeline (spec 2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Ingested, waiting for a session worker.
    PendingAgent,
    /// Claimed by a session worker that is running its turn.
    Processing,
    /// Resolved with a final reply.
    Processed,
    /// Its turn was stopped before it finished (newer message, `/stop`, shutdown).
    Interrupted,
    /// Its turn or its delivery failed for good.
    Error,
    /// Outgoing text waiting for its chatbot to deliver it.
    Pending,
    /// Shown on (or deliberately hidden from) the target platform.
    Delivered,
    /// Internal step (thought, tool call, tool result, system event) needing no delivery.
    Responded,
}

macro_rules! str_enum {
    ($ty:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The wire name (the spec's spelling).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($ty::$variant),)+
                    _ => Err(UnknownValue {
                        what: stringify!($ty),
                        value: s.chars().take(64).collect(),
                        expected: &[$($text),+],
                    }),
                }
            }
        }
    };
}

str_enum!(Role { User => "user", Assistant => "assistant", Tool => "tool", System => "system" });
str_enum!(MessageType {
    Text => "text",
    Thought => "thought",
    ToolCall => "tool_call",
    ToolResult => "tool_result",
});
str_enum!(Status {
    PendingAgent => "pending_agent",
    Processing => "processing",
    Processed => "processed",
    Interrupted => "interrupted",
    Error => "error",
    Pending => "pending",
    Delivered => "delivered",
    Responded => "responded",
});

/// A string that is not one of an enum's wire names (for example a status read from a foreign database).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}`: expected one of {}", expected.join(", "))]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static [&'static str],
}

/// A status change the transition table forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal status transition {from} -> {to}: allowed from {from} are [{}]", allowed_list(*from))]
pub struct IllegalTransition {
    pub from: Status,
    pub to: Status,
}

fn allowed_list(from: Status) -> String {
    from.allowed_next().iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

impl Status {
    /// The transition table, written once. Each row lists where a status may go next.
    ///
    /// - `pending_agent`: a worker claims it (`processing`), or it is abandoned before pickup
    ///   (`interrupted` by a newer message or `/stop`, `error` when its session is gone).
    /// - `processing`: the turn ends (`processed`, `interrupted`, `error`), or the worker died and
    ///   orphan recovery hands it back, or an agent of a round passed and the next one is asked
    ///   (`pending_agent`).
    /// - `pending`: the chatbot delivered it, or gave up for good.
    /// - `responded`: an intermediate step was rendered (`delivered`), or it was an unfinished tool
    ///   call when its turn was interrupted (`interrupted`).
    /// - `delivered`: a tool call that a UI already rendered can still be cut off by an
    ///   interruption (`interrupted`); nothing else leaves `delivered`.
    /// - `processed`, `interrupted`, `error`: terminal.
    pub const fn allowed_next(self) -> &'static [Status] {
        use Status::*;
        match self {
            PendingAgent => &[Processing, Interrupted, Error],
            Processing => &[Processed, Interrupted, Error, PendingAgent],
            Pending => &[Delivered, Error],
            Responded => &[Delivered, Interrupted],
            Delivered => &[Interrupted],
            Processed | Interrupted | Error => &[],
        }
    }

    /// Whether the table allows `self -> to`.
    pub fn can_transition_to(self, to: Status) -> bool {
        self.allowed_next().contains(&to)
    }

    /// `Ok(())` when the table allows `self -> to`, else a typed error naming both ends.
    pub fn check_transition(self, to: Status) -> Result<(), IllegalTransition> {
        if self.can_transition_to(to) { Ok(()) } else { Err(IllegalTransition { from: self, to }) }
    }

    /// No further change is possible.
    pub fn is_terminal(self) -> bool {
        self.allowed_next().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_round_trip() {
        for status in Status::ALL {
            let json = serde_json::to_string(status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
            assert_eq!(status.as_str().parse::<Status>().unwrap(), *status);
        }
        assert_eq!(MessageType::ToolCall.as_str(), "tool_call");
        assert_eq!(serde_json::to_string(&MessageType::ToolResult).unwrap(), "\"tool_result\"");
    }

    #[test]
    fn unknown_status_is_a_clear_error() {
        let err = "pending_agnet".parse::<Status>().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("unknown Status `pending_agnet`"), "{text}");
        assert!(text.contains("pending_agent"), "{text}");
    }
}
