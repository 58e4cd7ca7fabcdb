//! Phased ordering of a session's messages (spec §5.1), as a pure function.
//!
//! Turns come in the order their root messages were written; inside a turn, model step by model
//! step: thoughts, then tool calls, then tool results, then text, then anything injected for the
//! next step. Parallel tool calls of one model response therefore stay together, whatever order
//! their results were written in. The store implements the same order in SQL; this function is
//! the reference it is tested against, and what in-memory code uses.

use std::collections::HashMap;
use std::hash::BuildHasher;

use crate::ids::MessageId;
use crate::message::Message;

/// The id of the turn (its root message) that `message` belongs to, given every message by id.
/// A message whose parent is unknown is treated as the root of its own turn.
pub fn turn_root<'a, S: BuildHasher>(
    message: &'a Message,
    by_id: &HashMap<&MessageId, &'a Message, S>,
) -> &'a MessageId {
    let mut current = message;
    // Bounded walk: a corrupt parent cycle cannot hang us.
    for _ in 0..64 {
        match current.parent_id.as_ref().and_then(|parent| by_id.get(parent)) {
            Some(parent) => current = parent,
            None => return &current.id,
        }
    }
    &current.id
}

/// Sort messages (given in the order they were written) into phased order.
pub fn phased_order(messages: Vec<Message>) -> Vec<Message> {
    let by_id: HashMap<&MessageId, &Message> = messages.iter().map(|m| (&m.id, m)).collect();
    let position: HashMap<&MessageId, usize> = messages.iter().enumerate().map(|(index, m)| (&m.id, index)).collect();
    let mut keys = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        // The root's own position decides the turn's rank.
        let root = turn_root(message, &by_id);
        let rank = position.get(root).copied().unwrap_or(index);
        keys.push((rank, message.step, message.phase(), index));
    }
    let mut order: Vec<usize> = (0..messages.len()).collect();
    order.sort_by_key(|&i| keys[i]);
    let mut slots: Vec<Option<Message>> = messages.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}
