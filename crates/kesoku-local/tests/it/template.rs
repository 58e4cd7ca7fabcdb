//! Prompt rendering with the model's template, the tool fallback, and tokenization.

use crate::support::{TestResult, tiny};
use kesoku_local::testing::TinyModel;
use kesoku_local::{ChatMessage, ChatPrompt, ToolCall, ToolSpec};
use serde_json::json;

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Current weather of a city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }
}

fn tool_conversation() -> ChatPrompt {
    ChatPrompt {
        messages: vec![
            ChatMessage::system("Be brief."),
            ChatMessage::user("Weather in Oslo?"),
            ChatMessage::assistant_calls(
                "",
                vec![ToolCall {
                    id: Some("call-1".into()),
                    name: "get_weather".into(),
                    arguments: json!({"city": "Oslo"}),
                }],
            ),
            ChatMessage::tool_result("get_weather", Some("call-1".into()), "-3 C, snow"),
        ],
        tools: vec![weather_tool()],
    }
}

/// Renders `prompt` with a synthetic model carrying `template` and compares with `expected`.
fn check(template: Option<&str>, prompt: &ChatPrompt, expected: &str) -> TestResult {
    let spec = TinyModel { chat_template: template.map(str::to_owned), ..TinyModel::default() };
    let (_dir, model) = tiny(spec)?;
    let rendered = model.render_prompt(prompt)?;
    assert_eq!(rendered, expected);
    Ok(())
}

#[test]
fn chatml_from_the_file_renders_turns() -> TestResult {
    let prompt = ChatPrompt {
        messages: vec![
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("Hello!"),
            ChatMessage::user("25 + 15?"),
        ],
        tools: Vec::new(),
    };
    check(
        None,
        &prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n25 + 15?<|im_end|>\n<|im_start|>assistant\n",
    )
}

#[test]
fn templates_without_tools_get_the_documented_fallback() -> TestResult {
    let tools = r#"{"type":"function","function":{"name":"get_weather","description":"Current weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#;
    let expected = format!(
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
         <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nWeather in Oslo?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{{\"name\":\"get_weather\",\"arguments\":{{\"city\":\"Oslo\"}}}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n{{\"name\":\"get_weather\",\"content\":\"-3 C, snow\"}}\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
    check(None, &tool_conversation(), &expected)
}

#[test]
fn templates_that_handle_tools_receive_them_natively() -> TestResult {
    let template = "{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}\
        {% for m in messages %}[{{ m.role }}]{{ m.content }}\
        {% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}{% endif %}\
        {% if m.role == 'tool' %} (from {{ m.name }}){% endif %}\n{% endfor %}\
        {% if add_generation_prompt %}[assistant]{% endif %}";
    // trim_blocks (as Hugging Face renders) eats the newline after each block tag.
    let expected = "TOOLS get_weather;[system]Be brief.[user]Weather in Oslo?[assistant]CALL get_weather {\"city\": \"Oslo\"}[tool]-3 C, snow (from get_weather)[assistant]";
    check(Some(template), &tool_conversation(), expected)
}

#[test]
fn template_errors_are_reported_not_panicked() -> TestResult {
    let spec = TinyModel {
        chat_template: Some(
            "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}".into(),
        ),
        ..TinyModel::default()
    };
    let (_dir, model) = tiny(spec)?;
    let error = model.render_prompt(&ChatPrompt { messages: vec![ChatMessage::user("hi")], tools: Vec::new() });
    let message = error.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("chat template error") && message.contains("system first"), "{message}");
    Ok(())
}

#[test]
fn special_tokens_and_text_round_trip() -> TestResult {
    let (_dir, model) = tiny(TinyModel::default())?;
    let ids = model.tokenize("<|im_start|>user\nthe 42 naïve 🎉<|im_end|>")?;
    assert_eq!(ids.first(), Some(&1), "<|im_start|> is one token: {ids:?}");
    assert_eq!(ids.last(), Some(&2), "<|im_end|> is one token: {ids:?}");
    let the = model.tokenize(" the")?;
    assert_eq!(the.len(), 1, "merges apply: {the:?}");
    assert_eq!(model.detokenize(&ids)?, "<|im_start|>user\nthe 42 naïve 🎉<|im_end|>");
    Ok(())
}
