//! What a chatbot's platform can show, declared once per chatbot and read by the shared
//! delivery routine (spec §4.3 and the §5.3 visibility matrix).
//!
//! Not here: how a platform does any of it. A chatbot without intermediate UI gets its thoughts
//! and tool steps marked `delivered` without being shown; one without files or buttons gets
//! them as text ([`crate::answer`]).

/// What a platform supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Sent messages can be edited afterwards (a live status line).
    pub edits_in_place: bool,
    /// Conversations can be split into threads.
    pub threads: bool,
    /// Messages can carry buttons whose click comes back as an event.
    pub buttons: bool,
    /// Files can be uploaded with a message.
    pub files: bool,
    /// A "typing…" indicator can be shown.
    pub typing: bool,
    /// Longest text of one platform message, in characters.
    pub max_message_chars: usize,
    /// Largest file one message may carry, in bytes.
    pub max_file_bytes: u64,
    /// Thoughts and tool steps are shown while a turn runs (spec §4.3 "adapters with UI").
    pub shows_intermediates: bool,
}

impl Capabilities {
    /// A plain text channel: no edits, threads, buttons, files or typing; steps not shown.
    pub const fn text_only(max_message_chars: usize) -> Self {
        Capabilities {
            edits_in_place: false,
            threads: false,
            buttons: false,
            files: false,
            typing: false,
            max_message_chars,
            max_file_bytes: 0,
            shows_intermediates: false,
        }
    }
}
