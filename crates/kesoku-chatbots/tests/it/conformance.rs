//! The CLI chatbot runs the conformance kit: the terminal is its platform, what it printed is
//! what the platform shows.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use kesoku_chatbots::cli::{CLI_CHANNEL, CLI_CHATBOT, CLI_SENDER, CliChatbot, RenderMode};
use kesoku_chatbots::conformance::{Flaky, Harness, run_all};
use kesoku_chatbots::staging::Staging;
use kesoku_chatbots::{Chatbot, Inbound, ingest};
use kesoku_gateway::Gateway;

use crate::support::{Blocks, Fixture, fixture};

struct CliHarness {
    fixture: Fixture,
    printed: Blocks,
    chatbot: Arc<Flaky>,
}

#[async_trait]
impl Harness for CliHarness {
    fn chatbot(&self) -> Arc<dyn Chatbot> {
        self.chatbot.clone()
    }

    fn gateway(&self) -> Gateway {
        self.fixture.gateway.clone()
    }

    fn workspace(&self) -> PathBuf {
        self.fixture.workspace().to_owned()
    }

    fn channel_id(&self) -> String {
        CLI_CHANNEL.to_owned()
    }

    /// Every block printed, blank separators left out.
    async fn visible(&self) -> Vec<String> {
        self.printed.blocks().into_iter().filter(|block| !block.trim().is_empty()).collect()
    }

    async fn fail_transiently(&self, n: usize) {
        self.chatbot.fail_transiently(n);
    }

    async fn fail_permanently(&self) {
        self.chatbot.fail_permanently();
    }

    /// The terminal's inbound path is the CLI posting a line; the event id keys it.
    async fn user_says(&self, text: &str, event_id: &str) {
        let mut inbound = Inbound::text(CLI_CHATBOT, CLI_CHANNEL, CLI_SENDER, text);
        inbound.platform_key = Some(event_id.to_owned());
        ingest(&self.fixture.gateway, &Staging::new(self.workspace()), inbound).await.expect("ingest");
    }

    /// A terminal has no connection to lose.
    async fn drop_connection(&self) {}

    /// A printed line cannot be taken back.
    fn dedups_part_keys(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn the_cli_chatbot_passes_the_conformance_kit() {
    let fixture = fixture().await;
    let printed = Blocks::default();
    let cli = CliChatbot::with_writer(RenderMode::Plain, 80, Box::new(printed.clone()));
    let harness = CliHarness { fixture, printed, chatbot: Arc::new(Flaky::new(Arc::new(cli))) };
    run_all(&harness).await;
}
