//! The orchestration state machine of seed 003: one agent at a time, in order; a pass moves to
//! the next and grows the no-reply streak; the round halts when all have passed.

use kesoku_core::{AfterPass, Orchestration};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn a_round_dispatches_each_agent_once_in_order_then_halts() {
    let mut round = Orchestration::start(names(&["Ana", "Ben", "Cai"])).expect("three agents");
    let mut dispatched = vec![round.current().map(str::to_owned)];
    let mut streaks = vec![round.no_reply_streak];
    while let AfterPass::Dispatch(next) = round.after_pass() {
        dispatched.push(next.current().map(str::to_owned));
        streaks.push(next.no_reply_streak);
        round = next;
    }
    assert_eq!(dispatched, vec![Some("Ana".to_owned()), Some("Ben".to_owned()), Some("Cai".to_owned())]);
    assert_eq!(streaks, vec![0, 1, 2]);
}

#[test]
fn others_name_every_peer_but_the_dispatched_one() {
    let round = Orchestration::start(names(&["Ana", "Ben", "Cai"])).expect("three agents");
    let AfterPass::Dispatch(second) = round.after_pass() else { panic!("Ben is next") };
    assert_eq!(second.others().collect::<Vec<_>>(), vec!["Ana", "Cai"]);
}

#[test]
fn no_agents_no_round_and_a_single_agent_halts_after_its_pass() {
    assert_eq!(Orchestration::start(Vec::new()), None);
    let solo = Orchestration::start(names(&["Ana"])).expect("one agent");
    assert_eq!(solo.after_pass(), AfterPass::AllPassed);
}

#[test]
fn the_state_survives_the_root_metadata_round_trip() {
    let round = Orchestration::start(names(&["Ana", "Ben"])).expect("two agents");
    let AfterPass::Dispatch(next) = round.after_pass() else { panic!("Ben is next") };
    let mut request = kesoku_core::ActivationRequest::new(kesoku_core::ActivationKind::Message);
    request.agent = next.current().map(str::to_owned);
    request.orchestration = Some(next.clone());
    let metadata = kesoku_core::Metadata { activation: Some(Box::new(request)), ..Default::default() };
    let back = kesoku_core::Metadata::from_value(metadata.to_value()).expect("reads back");
    let request = back.activation.expect("activation kept");
    assert_eq!(request.orchestration, Some(next));
    assert_eq!(request.agent.as_deref(), Some("Ben"));
}
