//! `Secret`: an API key that cannot be printed by accident.
//!
//! `Debug` and `Display` print `[redacted]`; the only way to the value is [`Secret::expose`],
//! which the providers call when they set the request header. It is deliberately not
//! `Serialize`, so it cannot end up in a config dump or a log record either.

use std::fmt;

/// A secret string (an API key).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself: only for setting it where it is needed (a request header).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replace every occurrence of the secret in `text` with `[redacted]` (for vendor messages
    /// that might echo what they were sent).
    pub fn scrub(&self, text: &str) -> String {
        if self.0.len() < 4 {
            // Scrubbing a very short string would mangle unrelated text; such keys are not real keys.
            return text.to_owned();
        }
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}
