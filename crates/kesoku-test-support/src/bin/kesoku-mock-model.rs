//! A mock model server to run beside a real `kesoku start` (the web console's browser test in
//! `crates/kesoku-server/e2e`): it speaks Gemini's wire format on an address and answers each
//! conversation by what its user said ([`Behaviour::Rules`]), so many turns of many sessions
//! can share one server in any order.
//!
//! Usage: `kesoku-mock-model --addr 127.0.0.1:PORT [--scenario console]`. Any API key is
//! accepted. Not a model: the answers are the scenario's, whatever the question.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use kesoku_test_support::mock_llm::{
    Behaviour, MockAnswer, MockPart, MockReply, MockRule, MockUsage, Vendor, serve_vendor,
};
use serde_json::json;

/// The console's browser test: a tool turn, a failing tool, a turn long enough to be stopped,
/// a turn that runs long enough to be seen running, and a model that refuses a request.
fn console_scenario() -> Vec<MockRule> {
    let usage = MockUsage { input: 1200, output: 85, thought: 40, cached: 0 };
    let shell = |command: &str| MockPart::tool_call("", "run_shell_command", json!({ "command": command }));
    vec![
        MockRule::new(
            "What is the weather in Tokyo?",
            vec![
                MockReply::Answer(
                    MockAnswer::parts(vec![
                        MockPart::thought("I will search the web for the current weather in Tokyo.", None),
                        shell("sleep 2; echo 'Tokyo: 18 C, light rain'"),
                    ])
                    .with_usage(usage),
                ),
                MockReply::Answer(
                    MockAnswer::text("Here is what I found: Tokyo is at 18 C with light rain.").with_usage(usage),
                ),
            ],
        ),
        MockRule::new(
            "Please fail the search",
            vec![
                MockReply::Answer(MockAnswer::parts(vec![shell(
                    "sleep 1; echo 'the search backend answered HTTP 503' >&2; exit 3",
                )])),
                MockReply::text("The search tool failed: its backend answered HTTP 503."),
            ],
        ),
        MockRule::new(
            "A long question to interrupt",
            vec![MockReply::Delayed {
                delay: Duration::from_secs(600),
                reply: Box::new(MockReply::text("This answer comes too late.")),
            }],
        ),
        MockRule::new(
            "Check the disk usage",
            vec![
                MockReply::Answer(MockAnswer::parts(vec![
                    MockPart::thought("I will look at the disk usage with df.", None),
                    shell("sleep 4; df -h . | tail -n 1"),
                ])),
                MockReply::text("The build server's disk has room to spare."),
            ],
        ),
        MockRule::new("Please break the model", vec![MockReply::error(400, "mock: this request is refused")]),
        MockRule::new("", vec![MockReply::text("I am the console test's mock model.")]),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut addr: Option<SocketAddr> = None;
    let mut scenario = "console".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next();
        match (arg.as_str(), value) {
            ("--addr", Some(value)) => match value.parse() {
                Ok(parsed) => addr = Some(parsed),
                Err(error) => {
                    eprintln!("--addr `{value}` is not an address like 127.0.0.1:18799: {error}");
                    return ExitCode::from(2);
                }
            },
            ("--scenario", Some(value)) => scenario = value,
            (other, _) => {
                eprintln!(
                    "unknown argument `{other}`; usage: kesoku-mock-model --addr 127.0.0.1:PORT [--scenario console]"
                );
                return ExitCode::from(2);
            }
        }
    }
    let Some(addr) = addr else {
        eprintln!("--addr is required; usage: kesoku-mock-model --addr 127.0.0.1:PORT [--scenario console]");
        return ExitCode::from(2);
    };
    let rules = match scenario.as_str() {
        "console" => console_scenario(),
        other => {
            eprintln!("unknown scenario `{other}`; known: console");
            return ExitCode::from(2);
        }
    };
    println!("mock model (Gemini wire format) on http://{addr}, scenario {scenario}");
    match serve_vendor(addr, Vendor::Gemini, Behaviour::Rules(rules)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("the mock model could not serve on {addr}: {error}");
            ExitCode::FAILURE
        }
    }
}
