//! What awaits delivery, showing then marking `delivered`, and the delivery loop.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kesoku_chatbots::answer::OutboundPart;
use kesoku_chatbots::{Capabilities, Chatbot, Delivered, Deliverer, DeliveryError};
use kesoku_core::{Message, MessageId, Status, TurnOrigin};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, fixture, tool_turn};

/// Records what it was asked to show or send (a chatbot with step UI and no length limit).
#[derive(Default)]
struct Recorder {
    shown: Mutex<Vec<MessageId>>,
}

#[async_trait]
impl Chatbot for Recorder {
    fn chatbot_id(&self) -> &str {
        "cli"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { shows_intermediates: true, ..Capabilities::text_only(usize::MAX) }
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.shown.lock().expect("lock").push(step.id.clone());
        Ok(())
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        self.shown.lock().expect("lock").push(message.id.clone());
        Ok(part.key.clone())
    }
}

#[tokio::test]
async fn steps_and_answers_are_shown_once_and_marked_delivered_while_hidden_ones_are_not() {
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
    let deliverer = Deliverer::new(gateway.clone(), fixture.workspace());
    let mut shown = Vec::new();
    for message in turn.iter().chain([&nudge, &elsewhere]) {
        match deliverer.deliver(&recorder, message).await.expect("deliver") {
            Delivered::Shown => shown.push(message.id.clone()),
            Delivered::Skipped => {}
            other @ (Delivered::Marked | Delivered::Failed(_)) => panic!("{other:?} for {:?}", message.message_type),
        }
    }
    let expected: Vec<MessageId> = turn[1..].iter().map(|m| m.id.clone()).collect();
    assert_eq!(shown, expected, "thought, call, result and answer; not the root, the nudge, or discord's");
    assert_eq!(*recorder.shown.lock().expect("lock"), expected);
    for message in &turn[1..] {
        let stored = gateway.store().get_message(&message.id).await.expect("read").expect("exists");
        assert_eq!(stored.status, Status::Delivered, "{:?}", stored.message_type);
    }
    let nudge = gateway.store().get_message(&nudge.id).await.expect("read").expect("exists");
    assert_eq!(nudge.status, Status::Responded, "nudges stay as they are");
    assert!(!nudge.awaits_delivery() && !turn[0].awaits_delivery());
}

#[tokio::test]
async fn the_delivery_loop_takes_stored_work_first_then_live_work_and_stops_on_shutdown() {
    let fixture = fixture().await;
    let gateway = fixture.gateway.clone();
    let turn = tool_turn(&fixture.session);
    let origin = TurnOrigin::of(&turn[0], "Kesoku");
    let before = origin.notification("stored before the loop started");
    gateway.post(&before).await.expect("post");

    let recorder = Arc::new(Recorder::default());
    let shutdown = CancellationToken::new();
    let task = {
        let deliverer = Deliverer::new(gateway.clone(), fixture.workspace());
        let chatbot: Arc<dyn Chatbot> = recorder.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { deliverer.run(chatbot, shutdown).await })
    };
    let live = origin.notification("posted while it runs");
    gateway.post(&live).await.expect("post");
    eventually("the live message is delivered", || async {
        gateway.store().get_message(&live.id).await.expect("read").expect("exists").status == Status::Delivered
    })
    .await;
    shutdown.cancel();
    task.await.expect("the loop stops without a panic");
    assert_eq!(*recorder.shown.lock().expect("lock"), vec![before.id.clone(), live.id.clone()]);
}
