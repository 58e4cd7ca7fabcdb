//! Identifiers: newtypes over strings that sort by creation time and say what they are.
//!
//! New ids are `<prefix>_<ULID>` (`msg_01J…`, `sess_01J…`, `act_01J…`); any other string is
//! accepted as an id too, because the spec's own examples use ids like `msg_user_001`.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The prefix of freshly generated ids.
            pub const PREFIX: &'static str = $prefix;

            /// A new, time-sortable id.
            pub fn generate() -> Self {
                Self(format!("{}_{}", $prefix, ulid::Ulid::generate().to_string().to_lowercase()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id_type!(
    /// A message's id.
    MessageId,
    "msg"
);
id_type!(
    /// A session's id.
    SessionId,
    "sess"
);
id_type!(
    /// An activation's id (also its ledger row's id).
    ActivationId,
    "act"
);
id_type!(
    /// A background job's id (`run_shell_command` with `background`).
    JobId,
    "job"
);
id_type!(
    /// A follow-up's id (`schedule_followup`).
    FollowUpId,
    "fu"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_prefixed_and_sort_by_time() {
        let a = MessageId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = MessageId::generate();
        assert!(a.as_str().starts_with("msg_"));
        assert!(a < b, "{a} should sort before {b}");
        assert!(SessionId::generate().as_str().starts_with("sess_"));
    }
}
