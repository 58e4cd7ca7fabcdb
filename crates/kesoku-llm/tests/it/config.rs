//! Configuration parsing, key resolution, building, and secrets never showing.

use std::collections::BTreeMap;

use kesoku_llm::providers::{anthropic::AnthropicModel, gemini::GeminiModel, openai::OpenAiModel};
use kesoku_llm::{
    LlmErrorKind, ModelConfig, Provider, Request, RetryPolicy, Secret, ThinkingLevel, build_model,
    build_model_with_lookup, resolve_api_key,
};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockReply, MockServer, Vendor};

use crate::support::good_model;

#[derive(Debug, serde::Deserialize)]
struct File {
    models: BTreeMap<String, ModelConfig>,
}

#[test]
fn models_parse_from_toml() {
    let file: File = toml::from_str(
        r#"
        [models.fast]
        provider = "gemini"
        model = "gemini-2.5-flash"
        thinking = "low"
        max_output_tokens = 8192

        [models.fast.retry]
        max_attempts = 5

        [models.local]
        provider = "openai"
        model = "llama3.2"
        base_url = "http://localhost:11434/v1"
        context_window = 32768

        [models.local.timeouts]
        first_byte_seconds = 600

        [models.claude]
        provider = "anthropic"
        model = "claude-sonnet-4-5"
        api_key_env = "MY_ANTHROPIC_KEY"
        "#,
    )
    .expect("parses");
    let fast = &file.models["fast"];
    assert_eq!(fast.provider, Provider::Gemini);
    assert_eq!(fast.thinking, Some(ThinkingLevel::Low));
    assert_eq!(fast.retry.max_attempts, 5);
    assert_eq!(fast.retry.base_delay_seconds, RetryPolicy::default().base_delay_seconds);
    assert_eq!(fast.effective_base_url(), "https://generativelanguage.googleapis.com");
    assert_eq!(fast.effective_api_key_env().as_deref(), Some("GEMINI_API_KEY"));
    assert_eq!(fast.info().context_window, 1_048_576);
    let local = &file.models["local"];
    assert_eq!(local.timeouts.first_byte_seconds, 600.0);
    assert_eq!(local.effective_api_key_env(), None, "a local server gets no key unless named");
    assert_eq!(local.info().context_window, 32768);
    assert_eq!(file.models["claude"].effective_api_key_env().as_deref(), Some("MY_ANTHROPIC_KEY"));
    assert_eq!(
        ModelConfig::new(Provider::OpenAi, "gpt-4.1").effective_api_key_env().as_deref(),
        Some("OPENAI_API_KEY")
    );
}

#[test]
fn unknown_fields_are_rejected() {
    let error = toml::from_str::<File>("[models.x]\nprovider = \"openai\"\nmodel = \"m\"\napi_key = \"sk-inline\"\n")
        .expect_err("api_key is not a field");
    assert!(error.to_string().contains("api_key"), "{error}");
    let error =
        toml::from_str::<File>("[models.x]\nprovider = \"mistral\"\nmodel = \"m\"\n").expect_err("unknown provider");
    assert!(error.to_string().contains("mistral"), "{error}");
    let error =
        toml::from_str::<File>("[models.x]\nprovider = \"gemini\"\nmodel = \"m\"\n[models.x.retry]\nattempts = 2\n")
            .expect_err("unknown retry field");
    assert!(error.to_string().contains("attempts"), "{error}");
}

#[test]
fn keys_are_looked_up_by_variable_name() {
    let config = ModelConfig::new(Provider::Anthropic, "claude");
    let key = resolve_api_key("claude", &config, |name| (name == "ANTHROPIC_API_KEY").then(|| "sk-ant-123".to_owned()))
        .expect("found")
        .expect("a key");
    assert_eq!(key.expose(), "sk-ant-123");
    let error = resolve_api_key("claude", &config, |_| None).expect_err("missing");
    assert_eq!(error.kind(), LlmErrorKind::Config);
    assert!(error.to_string().contains("ANTHROPIC_API_KEY") && error.to_string().contains("claude"), "{error}");
    assert!(resolve_api_key("x", &config, |_| Some("  ".to_owned())).is_err(), "empty counts as unset");
    let mut local = ModelConfig::new(Provider::OpenAi, "llama");
    local.base_url = Some("http://localhost:8080/v1".to_owned());
    assert!(resolve_api_key("local", &local, |_| panic!("no lookup needed")).expect("fine").is_none());
    let model = build_model_with_lookup("local", &local, |_| None).expect("builds without a key");
    assert_eq!(model.name(), "local");
    assert_eq!(model.info().max_output_tokens, kesoku_llm::config::DEFAULT_MAX_OUTPUT_TOKENS);
}

#[test]
fn building_checks_the_config() {
    let error =
        build_model("g", &ModelConfig::new(Provider::Gemini, "gemini-2.5-flash"), None).err().expect("needs a key");
    assert!(error.to_string().contains("GEMINI_API_KEY"), "{error}");
    let mut bad_url = ModelConfig::new(Provider::OpenAi, "m");
    bad_url.base_url = Some("localhost:11434".to_owned());
    assert!(build_model("o", &bad_url, None).is_err());
    let mut bad_retry = ModelConfig::new(Provider::OpenAi, "m");
    bad_retry.retry.max_attempts = 0;
    assert!(build_model("o", &bad_retry, Some(Secret::new("k"))).is_err());
    let mut bad_timeout = ModelConfig::new(Provider::OpenAi, "m");
    bad_timeout.timeouts.idle_seconds = -1.0;
    assert!(build_model("o", &bad_timeout, Some(Secret::new("k"))).is_err());
}

#[test]
fn secrets_never_print() {
    let key = "sk-live-SECRETVALUE-42";
    let secret = Secret::new(key);
    assert_eq!(format!("{secret:?}"), "[redacted]");
    assert_eq!(format!("{secret}"), "[redacted]");
    let mut config = ModelConfig::new(Provider::Gemini, "gemini-2.5-flash");
    config.api_key_env = Some("GEMINI_API_KEY".to_owned());
    assert!(!format!("{config:?}").contains(key));
    let gemini = GeminiModel::new("g", &config, Some(secret.clone())).expect("builds");
    let openai = OpenAiModel::new("o", &ModelConfig::new(Provider::OpenAi, "m"), Some(secret.clone())).expect("builds");
    let anthropic =
        AnthropicModel::new("a", &ModelConfig::new(Provider::Anthropic, "m"), Some(secret)).expect("builds");
    for debug in [format!("{gemini:?}"), format!("{openai:?}"), format!("{anthropic:?}")] {
        assert!(!debug.contains(key) && !debug.contains("SECRETVALUE"), "{debug}");
        assert!(debug.contains("[redacted]"), "{debug}");
    }
}

#[tokio::test]
async fn a_vendor_message_quoting_the_key_is_scrubbed() {
    for vendor in [Vendor::Gemini, Vendor::OpenAi, Vendor::Anthropic] {
        let echo = format!("bad request: the key {MOCK_API_KEY} may not use this model");
        let server = MockServer::start(vendor, vec![MockReply::error(400, echo)]).await;
        let model = good_model(vendor, &server);
        let error = model.generate(&Request::user_text("hi")).await.expect_err("rejected");
        assert!(error.is_bad_request(), "{error}");
        assert!(!error.to_string().contains(MOCK_API_KEY), "{error}");
        assert!(!format!("{error:?}").contains(MOCK_API_KEY), "{error:?}");
        assert!(error.to_string().contains("[redacted]"), "{error}");
    }
}

#[tokio::test]
async fn a_prompt_too_long_is_recognised() {
    let server = MockServer::start(
        Vendor::Anthropic,
        vec![MockReply::error(400, "prompt is too long: 210000 tokens > 200000 maximum")],
    )
    .await;
    let error = good_model(Vendor::Anthropic, &server).generate(&Request::user_text("hi")).await.expect_err("too long");
    assert!(error.is_context_too_long() && !error.is_retryable(), "{error}");
}
