//! The `custom_id`s of the adapter's buttons: built where a button is drawn (the status
//! message's 🛑 Stop in [`super::status`], a question's options in [`super::outbound`]) and
//! read where a click arrives ([`super::commands`]).
//!
//! A `custom_id` carries everything its click needs, so buttons keep working after a restart:
//! - `kesoku:stop:<session_id>`: stop that session's turn;
//! - `kesoku:answer:<message_id>:<option>`: post option `<option>` (from 0) of the question in
//!   the agent's message `<message_id>` as the clicker's next message.
//!
//! Not here: drawing buttons or acting on clicks.

use kesoku_core::{MessageId, SessionId};

/// Discord's limit on a `custom_id`.
pub const MAX_CUSTOM_ID_CHARS: usize = 100;

const STOP_PREFIX: &str = "kesoku:stop:";
const ANSWER_PREFIX: &str = "kesoku:answer:";

/// What a button of ours does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ButtonAction {
    Stop { session_id: SessionId },
    Answer { message_id: MessageId, option: usize },
}

/// The `custom_id` of the 🛑 Stop button of a session's turn.
pub fn stop_custom_id(session_id: &SessionId) -> String {
    format!("{STOP_PREFIX}{session_id}")
}

/// The `custom_id` of option `option` (from 0) of the question in message `message_id`.
pub fn answer_custom_id(message_id: &MessageId, option: usize) -> String {
    format!("{ANSWER_PREFIX}{message_id}:{option}")
}

/// Read a `custom_id` of ours; `None` for anything else.
pub fn parse_custom_id(custom_id: &str) -> Option<ButtonAction> {
    if let Some(session) = custom_id.strip_prefix(STOP_PREFIX) {
        return (!session.is_empty()).then(|| ButtonAction::Stop { session_id: SessionId::from(session) });
    }
    let answer = custom_id.strip_prefix(ANSWER_PREFIX)?;
    // Message ids contain no `:`, but split at the last one anyway so a future id format with
    // colons still parses.
    let (message, option) = answer.rsplit_once(':')?;
    let option = option.parse().ok()?;
    (!message.is_empty()).then(|| ButtonAction::Answer { message_id: MessageId::from(message), option })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_ids_round_trip() {
        let session = SessionId::from("sess_01J0ABCDEF");
        let message = MessageId::from("msg_01J0XYZ");
        assert_eq!(stop_custom_id(&session), "kesoku:stop:sess_01J0ABCDEF");
        assert_eq!(parse_custom_id(&stop_custom_id(&session)), Some(ButtonAction::Stop { session_id: session }));
        assert_eq!(answer_custom_id(&message, 2), "kesoku:answer:msg_01J0XYZ:2");
        assert_eq!(
            parse_custom_id(&answer_custom_id(&message, 2)),
            Some(ButtonAction::Answer { message_id: message, option: 2 })
        );
        for foreign in
            ["", "kesoku:", "kesoku:stop:", "kesoku:answer:msg:x", "kesoku:answer::1", "other:stop:s", "kesoku:play:1"]
        {
            assert_eq!(parse_custom_id(foreign), None, "{foreign}");
        }
        assert!(answer_custom_id(&MessageId::from("msg_discord_1300000000000000001"), 24).len() <= MAX_CUSTOM_ID_CHARS);
    }
}
