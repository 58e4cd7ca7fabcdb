//! The WeChat chatbot runs the conformance kit against the fake iLink API: a real poll
//! (inbound) and a [`kesoku_chatbots::wechat::WeChatChatbot`] (delivery) over one store. The
//! kit's channel is Alice's direct chat; what the platform shows is what the fake recorded as
//! sent to her.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::conformance::{Harness, run_all};
use kesoku_gateway::Gateway;
use kesoku_test_support::wechat::Fault;

use crate::wechat::{ALICE, WeChatRig};

struct WeChatHarness {
    rig: WeChatRig,
    /// The kit's event ids and the WeChat message ids they became.
    events: Mutex<HashMap<String, String>>,
    markers: Mutex<usize>,
}

impl WeChatHarness {
    /// Wait until the poll handled everything sent so far: it handles messages in order, so
    /// once a fresh marker is ingested every earlier one was handled.
    async fn settled(&self) {
        let marker = {
            let mut markers = self.markers.lock().expect("markers");
            *markers += 1;
            format!("kit marker {markers}")
        };
        let id = self.rig.fake.user_says(ALICE, &marker);
        self.rig.wait_ingested(&id).await;
    }
}

#[async_trait]
impl Harness for WeChatHarness {
    fn chatbot(&self) -> Arc<dyn Chatbot> {
        self.rig.chatbot.clone()
    }

    fn gateway(&self) -> Gateway {
        self.rig.gateway.clone()
    }

    fn workspace(&self) -> PathBuf {
        self.rig.workspace.path().to_owned()
    }

    fn channel_id(&self) -> String {
        ALICE.to_owned()
    }

    /// Texts sent to Alice, and the names of files sent to her.
    async fn visible(&self) -> Vec<String> {
        self.rig
            .fake
            .sent()
            .into_iter()
            .filter(|message| message.to == ALICE)
            .map(|message| message.text.or(message.file_name.map(|name| format!("[file {name}]"))).unwrap_or_default())
            .collect()
    }

    async fn fail_transiently(&self, n: usize) {
        self.rig.fake.fail_next("sendmessage", n.saturating_sub(1), Fault::ServerError);
        self.rig.fake.fail_next("sendmessage", 1, Fault::Drop);
    }

    async fn fail_permanently(&self) {
        self.rig.fake.fail_next("sendmessage", 1, Fault::BadRequest);
    }

    async fn user_says(&self, text: &str, event_id: &str) {
        let known = self.events.lock().expect("events").get(event_id).cloned();
        match known {
            Some(message) => {
                self.rig.fake.redeliver(&message);
                self.settled().await;
            }
            None => {
                let message = self.rig.fake.user_says(ALICE, text);
                self.events.lock().expect("events").insert(event_id.to_owned(), message.clone());
                self.rig.wait_ingested(&message).await;
            }
        }
    }

    /// Break the long poll's connection mid-answer and wait until the poll met it.
    async fn drop_connection(&self) {
        self.rig.fake.fail_next("getupdates", 1, Fault::Drop);
        let met = self.rig.fake.wait_for(|state| state.pending_faults() == 0, Duration::from_secs(10)).await;
        assert!(met, "the poll met the dropped connection");
    }

    /// Every part carries a `client_id` from its key; the fake answers a repeat with the
    /// first message.
    fn dedups_part_keys(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn the_wechat_chatbot_passes_the_conformance_kit() {
    let rig = WeChatRig::start(&[ALICE]).await;
    let opening = rig.fake.user_says(ALICE, "kit conversation");
    rig.wait_ingested(&opening).await;
    let harness = WeChatHarness { rig, events: Mutex::new(HashMap::new()), markers: Mutex::new(0) };
    run_all(&harness).await;
    // The crash check's in-flight part really went to the fake twice, under one client id.
    let calls = harness.rig.fake.calls().iter().filter(|call| *call == "sendmessage").count();
    let sent = harness.rig.fake.sent().len();
    assert!(calls > sent, "some sends were repeats or faults ({calls} calls, {sent} shown)");
    assert!(harness.rig.fake.typing().is_empty() || harness.rig.fake.typing()[0].0 == ALICE);
    let mut rig = harness.rig;
    rig.stop().await;
}
