//! What awaits delivery, presenting then marking `delivered`, and the delivery loop.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use kesoku_chatbots::{Chatbot, ChatbotError, awaits_delivery, deliver, run_delivery};
use kesoku_core::{Message, MessageId, Status, TurnOrigin};
use tokio_util::sync::CancellationToken;

use crate::support::{fixture, tool_turn};

/// Records what it was asked to present.
#[derive(Default)]
struct Recorder {
    presented: Mutex<Vec<MessageId>>,
}

#[async_trait]
impl Chatbot for Recorder {
    fn chatbot_id(&self) -> &str {
        "cli"
    }

    async fn present(&self, message: &Message) -> Result<(), ChatbotError> {
        self.presented.lock().expect("lock").push(message.id.clone());
        Ok(())
    }
}

#[tokio::test]
async fn steps_and_answers_are_presented_once_and_marked_delivered_while_hidden_ones_are_not() {
    let fixture = fixture().await;
    let gateway = &fixture.gateway;
    let turn = tool_turn(&fixture.session);
    let origin = TurnOrigin::of(&turn[0], "Kesoku");
    let nudge = origin.nudge(1, "Your previous response was empty.");
    let elsewhere = {
        let mut message = origin.final_text(1, "for discord", None);
        message.chatbot_id = "discord".into();
        message
    };
    for message in turn.iter().chain([&nudge, &elsewhere]) {
        gateway.post(message).await.expect("post");
    }
    let recorder = Recorder::default();
    let mut presented = Vec::new();
    for message in turn.iter().chain([&nudge, &elsewhere]) {
        if deliver(gateway, &recorder, message).await.expect("deliver") {
            presented.push(message.id.clone());
        }
    }
    let expected: Vec<MessageId> = turn[1..].iter().map(|m| m.id.clone()).collect();
    assert_eq!(presented, expected, "thought, call, result and answer; not the root, the nudge, or discord's");
    assert_eq!(*recorder.presented.lock().expect("lock"), expected);
    for message in &turn[1..] {
        let stored = gateway.store().get_message(&message.id).await.expect("read").expect("exists");
        assert_eq!(stored.status, Status::Delivered, "{:?}", stored.message_type);
    }
    let nudge = gateway.store().get_message(&nudge.id).await.expect("read").expect("exists");
    assert_eq!(nudge.status, Status::Responded, "nudges stay as they are");
    assert!(!awaits_delivery(&nudge) && !awaits_delivery(&turn[0]));
}

#[tokio::test]
async fn the_delivery_loop_takes_stored_work_first_then_live_work_and_stops_on_shutdown() {
    let fixture = fixture().await;
    let gateway = fixture.gateway.clone();
    let turn = tool_turn(&fixture.session);
    let origin = TurnOrigin::of(&turn[0], "Kesoku");
    let before = origin.notification("stored before the loop started");
    gateway.post(&before).await.expect("post");

    let recorder = std::sync::Arc::new(Recorder::default());
    let shutdown = CancellationToken::new();
    let task = {
        let gateway = gateway.clone();
        let recorder = std::sync::Arc::clone(&recorder);
        let shutdown = shutdown.clone();
        tokio::spawn(async move { run_delivery(gateway, recorder.as_ref(), shutdown).await })
    };
    let live = origin.notification("posted while it runs");
    gateway.post(&live).await.expect("post");

    let wait = async {
        loop {
            let done =
                gateway.store().get_message(&live.id).await.expect("read").expect("exists").status == Status::Delivered;
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait).await.expect("the live message is delivered");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("the loop stops").expect("no panic");
    assert_eq!(*recorder.presented.lock().expect("lock"), vec![before.id.clone(), live.id.clone()]);
}
