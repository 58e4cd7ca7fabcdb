//! Tool calls in model output, table-driven: every accepted shape, and malformed output as text.

use kesoku_local::{ToolCall, parse_tool_calls};
use serde_json::{Value, json};

fn call(name: &str, arguments: Value) -> ToolCall {
    ToolCall { id: None, name: name.into(), arguments }
}

#[test]
fn tool_call_shapes() {
    let offered = ["get_weather", "add"];
    let cases: Vec<(&str, &str, &str, Vec<ToolCall>)> = vec![
        // (case, output, expected text, expected calls)
        ("plain text", "It is sunny.", "It is sunny.", vec![]),
        (
            "hermes tag",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
            "",
            vec![call("get_weather", json!({"city": "Oslo"}))],
        ),
        (
            "text around a tag",
            "Let me check.\n<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>\nDone.",
            "Let me check.\n\nDone.",
            vec![call("add", json!({"a": 1, "b": 2}))],
        ),
        (
            "two tags",
            "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>\n<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}</tool_call>",
            "",
            vec![call("add", json!({"a": 1, "b": 2})), call("get_weather", json!({"city": "Rome"}))],
        ),
        (
            "unclosed final tag",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 5, \"b\": 6}}",
            "",
            vec![call("add", json!({"a": 5, "b": 6}))],
        ),
        (
            "arguments as a JSON string",
            "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}</tool_call>",
            "",
            vec![call("add", json!({"a": 1, "b": 2}))],
        ),
        (
            "openai style wrapper, parameters key",
            "<tool_call>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}}</tool_call>",
            "",
            vec![call("get_weather", json!({"city": "Lima"}))],
        ),
        ("missing arguments", "<tool_call>{\"name\": \"add\"}</tool_call>", "", vec![call("add", json!({}))]),
        (
            "bare JSON of an offered tool",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
            "",
            vec![call("get_weather", json!({"city": "Oslo"}))],
        ),
        (
            "fenced JSON array",
            "```json\n[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 1}}]\n```",
            "",
            vec![call("add", json!({"a": 1, "b": 1}))],
        ),
        (
            "python tag",
            "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 2}}",
            "",
            vec![call("add", json!({"a": 2, "b": 2}))],
        ),
        // Malformed or not calls: all stay text.
        (
            "bare JSON naming an unknown tool",
            "{\"name\": \"rm_rf\", \"arguments\": {}}",
            "{\"name\": \"rm_rf\", \"arguments\": {}}",
            vec![],
        ),
        ("JSON that is not a call", "{\"answer\": 40}", "{\"answer\": 40}", vec![]),
        (
            "broken JSON in a tag",
            "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1,</tool_call> sorry",
            "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1,</tool_call> sorry",
            vec![],
        ),
        (
            "arguments not an object",
            "<tool_call>{\"name\": \"add\", \"arguments\": [1, 2]}</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": [1, 2]}</tool_call>",
            vec![],
        ),
        (
            "empty name",
            "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
            vec![],
        ),
        ("empty array", "[]", "[]", vec![]),
        ("stray opening tag only", "<tool_call>", "<tool_call>", vec![]),
        ("unicode text", "  Ça va 🎉 ", "Ça va 🎉", vec![]),
    ];
    for (case, output, text, calls) in cases {
        let parsed = parse_tool_calls(output, &offered);
        assert_eq!(parsed.text, text, "{case}: text");
        assert_eq!(parsed.tool_calls, calls, "{case}: calls");
    }
}
