//! Follow-ups end to end: the model schedules one from `kesoku chat`, `kesoku followups` lists
//! it, cancels it, and lists it again with `--all`.

use kesoku_core::{FollowUp, FollowUpState};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::json;

use crate::support::{Workspace, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);

#[tokio::test]
async fn a_followup_scheduled_in_chat_is_listed_and_cancelled_from_the_command_line() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call(
                "call_1",
                "schedule_followup",
                json!({"when": "2m", "task": "Remind the user to stretch."}),
            )])),
            MockReply::text("I will remind you in 2 minutes."),
        ],
    )
    .await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()).replacen(
        "[agent]\n",
        "[agent]\ntimezone = \"Asia/Singapore\"\n",
        1,
    ));
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let chat = workspace.run(&["chat", "remind me in 2 minutes to stretch"], &[KEY]).await;
    assert!(chat.status.success(), "chat failed: {}\n{}", stderr(&chat), stdout(&chat));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    // The model was told the id and the due time, in the configured zone (+08 in Singapore).
    let result = requests[1].body.to_string();
    assert!(result.contains("Follow-up fu_") && result.contains(" +08 (in 2m)."), "{result}");

    let listed = workspace.run(&["followups", "--json"], &[]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows: Vec<FollowUp> =
        stdout(&listed).lines().map(|line| serde_json::from_str(line).expect("a follow-up")).collect();
    assert_eq!(rows.len(), 1, "{}", stdout(&listed));
    let followup = &rows[0];
    assert_eq!((followup.task.as_str(), followup.state), ("Remind the user to stretch.", FollowUpState::Pending));
    assert_eq!((followup.chatbot_id.as_str(), followup.channel_id.as_str()), ("cli", "cli"));
    assert_eq!((followup.due_at - followup.created_at).num_seconds(), 120);

    let table = stdout(&workspace.run(&["followups"], &[]).await);
    let due = followup.due_at.with_timezone(&chrono::FixedOffset::east_opt(8 * 3600).expect("offset"));
    assert_eq!(
        table,
        format!(
            "{}  {} +08  session {}  Remind the user to stretch.\n",
            followup.id,
            due.format("%Y-%m-%d %H:%M:%S"),
            followup.session_id
        )
    );

    let cancel = workspace.run(&["followups", "cancel", followup.id.as_str()], &[]).await;
    assert!(cancel.status.success(), "{}", stderr(&cancel));
    assert!(stdout(&cancel).starts_with(&format!("cancelled {} (due ", followup.id)), "{}", stdout(&cancel));
    assert_eq!(stdout(&workspace.run(&["followups"], &[]).await), "no pending follow-ups\n");
    let all = stdout(&workspace.run(&["followups", "--all"], &[]).await);
    assert!(all.contains(&format!("{}  ", followup.id)) && all.contains("cancelled"), "{all}");
    let again = workspace.run(&["followups", "cancel", followup.id.as_str()], &[]).await;
    assert!(!again.status.success());
    assert!(stderr(&again).contains("was already cancelled"), "{}", stderr(&again));
    let unknown = workspace.run(&["followups", "cancel", "fu_nope"], &[]).await;
    assert!(stderr(&unknown).contains("there is no follow-up `fu_nope`"), "{}", stderr(&unknown));
}
