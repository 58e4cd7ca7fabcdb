//! The registry: lookup, stable order, argument checks, panics and cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use kesoku_tools::{Registry, RegistryError, Tool, ToolContext, ToolOutput, ToolSpec, ToolsConfig, builtin_registry};
use serde_json::{Value, json};

use crate::support::{Fixture, TestResult};

/// A tool that echoes its arguments and counts its calls, or panics when asked to.
struct Probe {
    spec: ToolSpec,
    calls: Arc<AtomicUsize>,
}

impl Probe {
    fn new(name: &str) -> (Self, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let spec = ToolSpec {
            name: name.to_owned(),
            description: "test probe".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "count": {"type": "integer"},
                    "panic": {"type": "boolean"}
                },
                "required": ["text"]
            }),
        };
        (Self { spec, calls: Arc::clone(&calls) }, calls)
    }
}

#[async_trait]
impl Tool for Probe {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: &ToolContext, arguments: Value) -> ToolOutput {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if arguments.get("panic") == Some(&Value::Bool(true)) {
            panic!("the probe blew up on purpose");
        }
        ToolOutput::success(arguments.to_string())
    }
}

fn probe_registry() -> Result<(Registry, Arc<AtomicUsize>), RegistryError> {
    let mut registry = Registry::new();
    let (probe, calls) = Probe::new("probe");
    registry.register(probe)?;
    Ok((registry, calls))
}

#[tokio::test]
async fn an_unknown_tool_is_an_error_listing_the_tools() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let output = registry.call("delete_everything", &fixture.ctx, json!({})).await;
    assert_eq!(
        output.error.as_deref(),
        Some(
            "there is no tool named `delete_everything`; the available tools are: edit_file, read_file, run_shell_command, write_file"
        )
    );
    assert_eq!(output.content, output.error.clone().unwrap_or_default());
    Ok(())
}

#[tokio::test]
async fn arguments_are_checked_against_the_schema_before_the_call() -> TestResult {
    let fixture = Fixture::new()?;
    let (registry, calls) = probe_registry()?;
    let cases = [
        (json!({}), "invalid arguments for tool `probe`: missing required field `text`"),
        (json!({ "text": 1 }), "invalid arguments for tool `probe`: `text`: expected string, got an integer"),
        (
            json!({ "text": "a", "count": "3" }),
            "invalid arguments for tool `probe`: `count`: expected integer, got a string",
        ),
        (json!([1]), "invalid arguments for tool `probe`: expected object, got an array"),
        (
            json!("not json"),
            "invalid arguments for tool `probe`: expected a JSON object of named arguments, got a string",
        ),
    ];
    for (arguments, expected) in cases {
        let output = registry.call("probe", &fixture.ctx, arguments).await;
        assert_eq!(output.error.as_deref(), Some(expected));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the tool must not be called with bad arguments");
    Ok(())
}

#[tokio::test]
async fn common_model_habits_are_accepted() -> TestResult {
    let fixture = Fixture::new()?;
    let (registry, calls) = probe_registry()?;
    // Arguments as a JSON string, an optional field sent as null, an integer sent as 3.0.
    let output =
        registry.call("probe", &fixture.ctx, json!("{\"text\": \"hi\", \"count\": 3.0, \"panic\": null}")).await;
    assert_eq!(output, ToolOutput::success(r#"{"text":"hi","count":3}"#));
    // No arguments at all, for a tool that needs none.
    let mut registry = Registry::new();
    let (mut probe, _) = Probe::new("no_args");
    probe.spec.parameters = json!({ "type": "object", "properties": {} });
    registry.register(probe)?;
    let output = registry.call("no_args", &fixture.ctx, Value::Null).await;
    assert_eq!(output, ToolOutput::success("{}"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_panicking_tool_becomes_an_error_output() -> TestResult {
    let fixture = Fixture::new()?;
    let (registry, calls) = probe_registry()?;
    let output = registry.call("probe", &fixture.ctx, json!({ "text": "x", "panic": true })).await;
    assert_eq!(
        output.error.as_deref(),
        Some(
            "tool `probe` failed unexpectedly (it panicked: the probe blew up on purpose); this is a bug in the \
             tool, not a problem with your arguments"
        )
    );
    // The registry and the tool are still usable.
    let output = registry.call("probe", &fixture.ctx, json!({ "text": "again" })).await;
    assert_eq!(output.error, None);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    Ok(())
}

#[tokio::test]
async fn a_cancelled_turn_does_not_start_tools() -> TestResult {
    let fixture = Fixture::new()?;
    let (registry, calls) = probe_registry()?;
    let ctx = fixture.ctx.clone();
    ctx.cancel.cancel();
    let output = registry.call("probe", &ctx, json!({ "text": "x" })).await;
    assert_eq!(output.error.as_deref(), Some("tool `probe` was not run: the turn was cancelled"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn registration_checks_names_schemas_and_duplicates() -> TestResult {
    let mut registry = Registry::new();
    registry.register(Probe::new("probe").0)?;
    assert_eq!(
        registry.register(Probe::new("probe").0),
        Err(RegistryError::DuplicateName { name: "probe".to_owned() })
    );
    assert_eq!(
        registry.register(Probe::new("has space").0),
        Err(RegistryError::InvalidName { name: "has space".to_owned() })
    );
    let (mut bad_schema, _) = Probe::new("bad_schema");
    bad_schema.spec.parameters = json!({ "type": "string" });
    assert!(matches!(registry.register(bad_schema), Err(RegistryError::InvalidSchema { .. })));
    assert_eq!(registry.len(), 1);
    Ok(())
}

#[test]
fn specs_come_in_name_order_whatever_the_registration_order() -> TestResult {
    let mut forward = Registry::new();
    let mut backward = Registry::new();
    for name in ["b_tool", "a_tool", "c_tool"] {
        forward.register(Probe::new(name).0)?;
    }
    for name in ["c_tool", "a_tool", "b_tool"] {
        backward.register(Probe::new(name).0)?;
    }
    let names = |registry: &Registry| registry.specs().map(|spec| spec.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&forward), ["a_tool", "b_tool", "c_tool"]);
    assert_eq!(names(&forward), names(&backward));
    Ok(())
}

#[test]
fn builtin_tools_and_their_specs() {
    let registry = builtin_registry(&ToolsConfig::default());
    assert_eq!(registry.names().collect::<Vec<_>>(), ["edit_file", "read_file", "run_shell_command", "write_file"]);
    let specs: Vec<&ToolSpec> = registry.specs().collect();
    insta::assert_json_snapshot!("builtin_specs", specs);

    let disabled = builtin_registry(&ToolsConfig {
        disabled: vec!["run_shell_command".to_owned(), "write_file".to_owned()],
        ..ToolsConfig::default()
    });
    assert_eq!(disabled.names().collect::<Vec<_>>(), ["edit_file", "read_file"]);
}
