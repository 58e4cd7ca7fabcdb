//! Every cell of the status transition table.

use kesoku_core::Status::{self, *};

/// The table as the spec's lifecycle (§4) and the foundation issue state it, written out cell by
/// cell independently of the code's table.
const LEGAL: &[(Status, Status)] = &[
    (PendingAgent, Processing),
    (PendingAgent, Interrupted),
    (PendingAgent, Error),
    (Processing, Processed),
    (Processing, Interrupted),
    (Processing, Error),
    (Processing, PendingAgent),
    (Pending, Delivered),
    (Pending, Error),
    (Responded, Delivered),
    (Responded, Interrupted),
    (Delivered, Interrupted),
];

#[test]
fn every_cell_matches_the_written_table() {
    for &from in Status::ALL {
        for &to in Status::ALL {
            let expected = LEGAL.contains(&(from, to));
            assert_eq!(from.can_transition_to(to), expected, "{from} -> {to}");
            match from.check_transition(to) {
                Ok(()) => assert!(expected),
                Err(error) => {
                    assert!(!expected);
                    let text = error.to_string();
                    assert!(text.contains(&format!("{from} -> {to}")), "{text}");
                }
            }
        }
    }
}

#[test]
fn terminal_statuses_go_nowhere() {
    for status in [Processed, Interrupted, Error] {
        assert!(status.is_terminal(), "{status}");
    }
    for status in [PendingAgent, Processing, Pending, Responded, Delivered] {
        assert!(!status.is_terminal(), "{status}");
    }
}
