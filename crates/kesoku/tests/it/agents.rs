//! Configured agents (`[[agents]]`) through the real binary: a round in the CLI channel, where
//! the first agent passes and the second answers, and a persona naming an unknown tool.

use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockReply, MockServer, Vendor};

use crate::support::{Workspace, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);

const TEAM: &str = "\n[[agents]]\nname = \"Ana\"\nintro = \"You are Ana. You answer questions about code; pass on \
                    anything else.\"\nchannels = [\"cli\"]\n\n[[agents]]\nname = \"Ben\"\nintro = \"You are Ben. You \
                    answer questions about dates.\"\ntools = [\"read_file\"]\nchannels = [\"cli\"]\n";

#[tokio::test]
async fn in_the_cli_channel_ana_passes_and_ben_answers() {
    let server =
        MockServer::start(Vendor::OpenAi, vec![MockReply::text("pass"), MockReply::text("Ben: it is a Friday.")]).await;
    let workspace = Workspace::with_config(&format!("{}{TEAM}", mock_model(&server.base_url())));
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));

    let output = workspace.run(&["chat", "Which weekday is 2027-01-01?"], &[KEY]).await;
    let out = stdout(&output);
    assert!(output.status.success(), "chat failed: {}\n{out}", stderr(&output));
    assert!(out.contains("Ben: it is a Friday."), "{out}");
    assert!(!out.lines().any(|line| line.trim() == "pass"), "a pass is not shown: {out}");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let (ana, ben) = (requests[0].body.to_string(), requests[1].body.to_string());
    assert!(ana.contains("You are Ana.") && ana.contains("other agents in this channel: Ben"), "{ana}");
    assert!(ben.contains("You are Ben.") && ben.contains("other agents in this channel: Ana"), "{ben}");
    assert!(ben.contains("\"read_file\"") && !ben.contains("\"run_shell_command\""), "Ben's tools only: {ben}");

    let ledger = workspace.run(&["ledger"], &[]).await;
    let lines = stdout(&ledger);
    assert!(lines.contains("agent Ana") && lines.contains("agent Ben"), "{lines}");
}

#[tokio::test]
async fn an_agent_naming_a_tool_that_does_not_exist_stops_the_start() {
    let server = MockServer::start(Vendor::OpenAi, vec![]).await;
    let team = TEAM.replace("tools = [\"read_file\"]", "tools = [\"reed_file\"]");
    let workspace = Workspace::with_config(&format!("{}{team}", mock_model(&server.base_url())));
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let output = workspace.run(&["chat", "hello"], &[KEY]).await;
    assert!(!output.status.success());
    let error = stderr(&output);
    assert!(
        error.contains(
            "[[agents]] entry 2 (name = \"Ben\"): tools names `reed_file`, which is not a tool of this \
                        configuration; known tools:"
        ) && error.contains("read_file"),
        "{error}"
    );
    assert!(server.requests().is_empty());
}
