//! The Google Chat chatbot runs the conformance kit against the fake: a real [`GoogleChat`]
//! pull loop (inbound) and a [`GoogleChatChatbot`] (delivery) over one store. The kit's
//! channel is the thread Alice's first message started in a room; what the platform shows is
//! the fake's messages in that thread, cards rendered as text.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::conformance::{Harness, run_all};
use kesoku_gateway::Gateway;
use kesoku_test_support::google_chat::{FakeGoogleChatOptions, Said};

use crate::google_chat::{Rig, WAIT};

struct GoogleChatHarness {
    rig: Rig,
    /// The kit's conversation: the thread of Alice's first message.
    thread: String,
    /// The kit's event ids and what they published.
    events: Mutex<HashMap<String, Said>>,
}

#[async_trait]
impl Harness for GoogleChatHarness {
    fn chatbot(&self) -> Arc<dyn Chatbot> {
        self.rig.chatbot.clone()
    }

    fn gateway(&self) -> Gateway {
        self.rig.gateway.clone()
    }

    fn workspace(&self) -> PathBuf {
        self.rig.workspace()
    }

    fn channel_id(&self) -> String {
        self.thread.clone()
    }

    async fn visible(&self) -> Vec<String> {
        self.rig.visible(&self.thread)
    }

    async fn fail_transiently(&self, n: usize) {
        self.rig.fake.fail_chat(n, 503);
    }

    /// Chat's answer when the space is gone or the app was removed from it.
    async fn fail_permanently(&self) {
        self.rig.fake.fail_chat(1, 404);
    }

    /// Alice writes in the thread; an event id seen before makes Chat publish that event
    /// again as a new Pub/Sub message (the app must store it once).
    async fn user_says(&self, text: &str, event_id: &str) {
        let known = self.events.lock().expect("events").get(event_id).cloned();
        match known {
            Some(said) => {
                let again = self.rig.fake.publish_again(&said.pubsub_id);
                self.rig.wait_acked(&again).await;
            }
            None => {
                let said = self.rig.fake.user_says(&self.rig.room, Some(&self.thread), &self.rig.alice, text);
                self.rig.wait_stored(&said).await;
                self.events.lock().expect("events").insert(event_id.to_owned(), said);
            }
        }
    }

    /// Pub/Sub has no connection to drop: the next pull fails instead, and the loop pulls again.
    async fn drop_connection(&self) {
        self.rig.fake.fail_pulls(1, 503);
        let failed = self
            .rig
            .fake
            .wait_for(|fake| fake.requests().iter().any(|r| r.path.ends_with(":pull") && r.status == 503), WAIT)
            .await;
        assert!(failed, "the failed pull reached the adapter");
    }

    /// Every create is named `client-p-…` and carries a `requestId`: Chat answers a resend
    /// with the first message.
    fn dedups_part_keys(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn the_google_chat_chatbot_passes_the_conformance_kit() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let opening = rig.fake.user_says(&rig.room, None, &rig.alice, "kit conversation");
    rig.wait_stored(&opening).await;
    let harness = GoogleChatHarness { thread: opening.thread.clone(), rig, events: Mutex::new(HashMap::new()) };
    run_all(&harness).await;
    let requests = harness.rig.fake.requests();
    let statuses: Vec<u16> = requests.iter().map(|request| request.status).collect();
    assert!(statuses.contains(&503) && statuses.contains(&404), "the faults reached the adapter: {statuses:?}");
    // The crash check's in-flight part went to Chat twice; its requestId kept it to one message.
    let mut request_ids: Vec<&str> = requests
        .iter()
        .filter(|r| r.method == "POST" && r.status == 200 && r.path.ends_with("/messages"))
        .filter_map(|r| r.query.get("requestId").map(String::as_str))
        .collect();
    let sent = request_ids.len();
    request_ids.sort_unstable();
    request_ids.dedup();
    assert_eq!(sent - request_ids.len(), 1, "exactly one part was sent again with its requestId");
}
