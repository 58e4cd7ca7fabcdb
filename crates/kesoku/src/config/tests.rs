//! Every table of `kesoku.toml` takes any subset of its keys: a key left out has its documented
//! default. One case per table sets a single key and expects the configuration of an empty file
//! with only that key changed.

use std::path::Path;

use kesoku_agent::Limits;
use kesoku_chatbots::cron::{CronJob, CronJobConfig};
use kesoku_chatbots::discord::{ChannelOverride, DiscordConfig};
use kesoku_core::Lane;
use kesoku_llm::{ModelConfig, Provider, RetryPolicy, Timeouts};

use super::{Config, HttpSection, ModelEntry};

const PATH: &str = "/configs/kesoku.toml";

fn parse(text: &str) -> Config {
    match Config::parse(Path::new(PATH), text) {
        Ok(config) => config,
        Err(error) => panic!("`{text}` should parse: {error:#}"),
    }
}

/// A table, the file setting one of its keys (plus the keys that name an entry, for entries),
/// and what that changes in the configuration of an empty file.
struct Case {
    table: &'static str,
    text: &'static str,
    change: fn(&mut Config),
}

fn remote(provider: Provider, model: &str) -> ModelConfig {
    ModelConfig::new(provider, model)
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            table: "[workspace]",
            text: "[workspace]\ndir = \"work\"\n",
            change: |config| config.workspace_dir = Path::new("/configs/work").to_owned(),
        },
        Case { table: "[agent]", text: "[agent]\nmax_depth = 2\n", change: |config| config.agent.max_depth = 2 },
        Case {
            table: "[agent]",
            text: "[agent]\nchannel_context_messages = 0\nthread_context_messages = 3\n",
            change: |config| {
                config.agent.channel_context_messages = 0;
                config.agent.thread_context_messages = 3;
            },
        },
        Case {
            table: "[agent.compaction]",
            text: "[agent.compaction]\nkeep_recent_turns = 9\n",
            change: |config| config.agent.compaction.keep_recent_turns = 9,
        },
        Case {
            table: "[limits.interactive]",
            text: "[limits.interactive]\ntool_calls = 2\n",
            change: |config| {
                config.limits.interactive = Some(Limits { tool_calls: 2, ..Limits::default_for(Lane::Interactive) })
            },
        },
        Case {
            table: "[limits.responsive]",
            text: "[limits.responsive]\nruntime_s = 60\n",
            change: |config| {
                config.limits.responsive = Some(Limits { runtime_s: 60, ..Limits::default_for(Lane::Responsive) })
            },
        },
        Case {
            table: "[limits.background]",
            text: "[limits.background]\nmodel_calls = 3\n",
            change: |config| {
                config.limits.background = Some(Limits { model_calls: 3, ..Limits::default_for(Lane::Background) })
            },
        },
        Case {
            table: "[models.NAME]",
            text: "[models.hosted]\nprovider = \"openai\"\nmodel = \"m\"\n",
            change: |config| {
                config.models.insert("hosted".into(), ModelEntry::Remote(remote(Provider::OpenAi, "m")));
            },
        },
        Case {
            table: "[models.NAME.timeouts]",
            text: "[models.hosted]\nprovider = \"gemini\"\nmodel = \"m\"\n[models.hosted.timeouts]\nidle_seconds = 5\n",
            change: |config| {
                let model = ModelConfig {
                    timeouts: Timeouts { idle_seconds: 5.0, ..Timeouts::default() },
                    ..remote(Provider::Gemini, "m")
                };
                config.models.insert("hosted".into(), ModelEntry::Remote(model));
            },
        },
        Case {
            table: "[models.NAME.retry]",
            text: "[models.hosted]\nprovider = \"anthropic\"\nmodel = \"m\"\n[models.hosted.retry]\nmax_attempts = 1\n",
            change: |config| {
                let model = ModelConfig {
                    retry: RetryPolicy { max_attempts: 1, ..RetryPolicy::default() },
                    ..remote(Provider::Anthropic, "m")
                };
                config.models.insert("hosted".into(), ModelEntry::Remote(model));
            },
        },
        Case {
            table: "[models.NAME] (local)",
            text: "[models.small]\nprovider = \"local\"\npath = \"m.gguf\"\n",
            change: |config| {
                let model = kesoku_local::LocalModelConfig::new("/configs/m.gguf");
                config.models.insert("small".into(), ModelEntry::Local(model));
            },
        },
        Case {
            table: "[tools]",
            text: "[tools]\nmax_concurrent_processes = 2\n",
            change: |config| config.tools.max_concurrent_processes = 2,
        },
        Case {
            table: "[tools.shell]",
            text: "[tools.shell]\nkill_grace_s = 1\n",
            change: |config| config.tools.shell.kill_grace_s = 1,
        },
        Case {
            table: "[tools.files]",
            text: "[tools.files]\nmax_read_chars = 2000\n",
            change: |config| config.tools.files.max_read_chars = 2000,
        },
        Case {
            table: "[tools.http]",
            text: "[tools.http]\nallowed_hosts = [\"api.github.com\"]\n",
            change: |config| config.tools.http.allowed_hosts = vec!["api.github.com".into()],
        },
        Case {
            table: "[[cron]] delegation_user",
            text: "[[cron]]\nname = \"mine\"\nschedule = \"@daily\"\nprompt = \"report\"\nchannel = \"ops\"\ndelegation_user = \"alice\"\n",
            change: |config| {
                let job = CronJob::parse(CronJobConfig {
                    name: "mine".into(),
                    schedule: "@daily".into(),
                    prompt: "report".into(),
                    chatbot: "api".into(),
                    channel: "ops".into(),
                    timezone: None,
                    catch_up: true,
                    model: None,
                    output_schema: None,
                    delegation_user: Some("alice".into()),
                });
                config.cron.push(job.expect("a valid job"));
            },
        },
        Case {
            table: "[service]",
            text: "[service]\nshutdown_grace_s = 3\n",
            change: |config| config.service.shutdown_grace_s = 3,
        },
        Case {
            table: "[http]",
            text: "[http]\ntoken_env = \"TOKEN\"\n",
            change: |config| {
                config.http = Some(HttpSection { listen: "127.0.0.1:8787".into(), token_env: Some("TOKEN".into()) });
            },
        },
        Case {
            table: "[broker]",
            text: "[broker]\nurl = \"redis://127.0.0.1:6379\"\n",
            change: |config| config.broker.url = Some("redis://127.0.0.1:6379".into()),
        },
        Case {
            table: "[[cron]]",
            text: "[[cron]]\nname = \"daily\"\nschedule = \"@daily\"\nprompt = \"report\"\nchannel = \"ops\"\n",
            change: |config| {
                let job = CronJob::parse(CronJobConfig {
                    name: "daily".into(),
                    schedule: "@daily".into(),
                    prompt: "report".into(),
                    chatbot: "api".into(),
                    channel: "ops".into(),
                    timezone: None,
                    catch_up: true,
                    model: None,
                    output_schema: None,
                    delegation_user: None,
                });
                config.cron.push(job.expect("a valid job"));
            },
        },
        Case {
            table: "[[chatbots.discord]]",
            text: "[[chatbots.discord]]\ntimezone = \"Asia/Singapore\"\n",
            change: |config| {
                config
                    .chatbots
                    .discord
                    .push(DiscordConfig { timezone: "Asia/Singapore".into(), ..DiscordConfig::default() })
            },
        },
        Case {
            table: "[[chatbots.discord.channels]]",
            text: "[[chatbots.discord]]\n[[chatbots.discord.channels]]\nchannels = [\"general\"]\n",
            change: |config| {
                let channel = ChannelOverride { channels: vec!["general".into()], ..ChannelOverride::default() };
                config.chatbots.discord.push(DiscordConfig { channels: vec![channel], ..DiscordConfig::default() })
            },
        },
    ]
}

#[test]
fn two_chatbots_with_one_id_are_refused_naming_the_id() {
    let text = "[[chatbots.discord]]\n[[chatbots.discord]]\ntoken_env = \"OTHER\"\n";
    let error = Config::parse(Path::new(PATH), text).err().map(|error| format!("{error:#}")).unwrap_or_default();
    assert!(error.contains("entry 2: id = \"discord\" is already taken"), "{error}");
    for taken in ["api", "system", "agent"] {
        let text = format!("[[chatbots.discord]]\nid = \"{taken}\"\n");
        let error = Config::parse(Path::new(PATH), &text).err().map(|error| format!("{error:#}")).unwrap_or_default();
        assert!(error.contains(&format!("id = \"{taken}\" is already taken")), "{error}");
    }
}

#[test]
fn a_platform_entry_of_each_kind_is_checked_and_shares_the_id_space() {
    let subscription = "subscription = \"projects/p/subscriptions/s\"\n";
    let text = format!(
        "[[chatbots.google_chat]]\n{subscription}[[chatbots.wechat]]\n[[chatbots.wechat]]\nid = \"wechat_work\"\n"
    );
    let config = parse(&text);
    assert_eq!(config.chatbots.ids(), ["google_chat", "wechat", "wechat_work"]);
    let text = format!("[[chatbots.google_chat]]\n{subscription}id = \"wechat\"\n[[chatbots.wechat]]\n");
    let error = Config::parse(Path::new(PATH), &text).err().map(|error| format!("{error:#}")).unwrap_or_default();
    assert!(error.contains("[[chatbots.wechat]] entry 1: id = \"wechat\" is already taken"), "{error}");
    let error = Config::parse(Path::new(PATH), "[[chatbots.google_chat]]\n")
        .err()
        .map(|error| format!("{error:#}"))
        .unwrap_or_default();
    assert!(error.contains("[[chatbots.google_chat]] entry 1") && error.contains("projects/PROJECT"), "{error}");
}

#[test]
fn a_cron_job_for_a_chatbot_that_is_not_configured_is_refused_at_load() {
    let job = "[[cron]]\nname = \"status\"\nschedule = \"@hourly\"\nprompt = \"report\"\nchannel = \"room@chatroom\"\nchatbot = \"wechat\"\n";
    let error = Config::parse(Path::new(PATH), job).err().map(|error| format!("{error:#}")).unwrap_or_default();
    assert!(error.contains("[[cron]] job `status`: chatbot = \"wechat\" is not a configured chatbot"), "{error}");
    let config = parse(&format!("{job}[[chatbots.wechat]]\n"));
    assert_eq!(config.cron[0].config.chatbot, "wechat");
}

#[test]
fn a_bad_discord_timezone_is_refused_at_load() {
    let error = Config::parse(Path::new(PATH), "[[chatbots.discord]]\ntimezone = \"Mars/Olympus\"\n")
        .err()
        .map(|error| format!("{error:#}"))
        .unwrap_or_default();
    assert!(error.contains("[[chatbots.discord]] entry 1") && error.contains("Mars/Olympus"), "{error}");
}

#[test]
fn every_table_takes_one_key_and_defaults_the_rest() {
    // Every table is tried before failing, so one run names every table with the defect.
    let mut failures = Vec::new();
    for case in cases() {
        let mut expected = parse("");
        (case.change)(&mut expected);
        match Config::parse(Path::new(PATH), case.text) {
            // The whole configuration is compared: no other key may move.
            Ok(parsed) if format!("{parsed:#?}") == format!("{expected:#?}") => {}
            Ok(parsed) => failures.push(format!("{}: got {parsed:#?}\nexpected {expected:#?}", case.table)),
            Err(error) => failures.push(format!("{}: {error:#}", case.table)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_broker_section_selects_redis_and_refuses_what_cannot_work() {
    let defaults = parse("");
    assert!(defaults.broker.redis().is_none(), "no url: the in-process broker");
    let config = parse("[broker]\nurl = \"redis://cache:6379/2\"\nprefix = \"prod\"\nreclaim_after_s = 30\n");
    let options = config.broker.redis().expect("redis selected");
    assert_eq!((options.url.as_str(), options.prefix.as_str()), ("redis://cache:6379/2", "prod"));
    assert_eq!(options.reclaim_after, std::time::Duration::from_secs(30));
    for (text, says) in [
        ("[broker]\nurl = \"http://cache\"\n", "redis://"),
        ("[broker]\nprefix = \" \"\n", "prefix"),
        ("[broker]\nreclaim_after_s = 0\n", "reclaim_after_s"),
        ("[broker]\noperation_timeout_ms = 0\n", "operation_timeout_ms"),
    ] {
        let error = Config::parse(Path::new(PATH), text).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(error.contains("[broker]") && error.contains(says), "{text}: {error}");
    }
    let defaults = parse("[broker]\nurl = \"redis://cache\"\n").broker.redis().expect("redis selected");
    assert_eq!(defaults.operation_timeout, kesoku_broker::RedisOptions::DEFAULT_OPERATION_TIMEOUT);
    let bounded = parse("[broker]\nurl = \"redis://cache\"\noperation_timeout_ms = 1500\n");
    let options = bounded.broker.redis().expect("redis selected");
    assert_eq!(options.operation_timeout, std::time::Duration::from_millis(1500));
}

#[test]
fn the_database_section_sizes_and_bounds_the_postgres_pool() {
    use std::time::Duration;
    assert_eq!(parse("").database.pool(), kesoku_store::PgPoolSettings::default());
    let config = parse("[database]\nmax_connections = 20\nacquire_timeout_ms = 2500\nstatement_timeout_ms = 0\n");
    let pool = config.database.pool();
    assert_eq!((pool.max_connections, pool.acquire_timeout), (20, Duration::from_millis(2500)));
    assert_eq!(pool.statement_timeout, None, "0 leaves the server's statement_timeout");
    for (text, says) in [
        ("[database]\nmax_connections = 0\n", "[database] max_connections"),
        ("[database]\nacquire_timeout_ms = 0\n", "[database] acquire_timeout_ms"),
        ("[database]\npool = 3\n", "unknown field `pool`"),
    ] {
        let error = Config::parse(Path::new(PATH), text).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(error.contains(says), "{text}: {error}");
    }
}

#[test]
fn the_documented_lane_defaults_fill_a_partial_lane() {
    // The values the template and README document for `[limits.interactive]`.
    let config = parse("[limits.interactive]\ntool_calls = 2\n");
    assert_eq!(config.limits.for_lane(Lane::Interactive), Limits { runtime_s: 900, model_calls: 40, tool_calls: 2 });
    assert_eq!(config.limits.for_lane(Lane::Background), Limits::default_for(Lane::Background));
}

#[test]
fn an_unknown_key_in_a_limits_table_is_still_an_error_naming_its_line() {
    let error = Config::parse(Path::new(PATH), "[limits.interactive]\ntool_call = 2\n")
        .err()
        .map(|error| format!("{error:#}"))
        .unwrap_or_default();
    assert!(error.contains("kesoku.toml:2:1: unknown field `tool_call`"), "{error}");
}

#[test]
fn a_cron_job_naming_an_unknown_model_is_refused_at_load() {
    let job =
        "[[cron]]\nname = \"daily\"\nschedule = \"@daily\"\nprompt = \"report\"\nchannel = \"ops\"\nmodel = \"big\"\n";
    let error = Config::parse(Path::new(PATH), job).err().map(|error| format!("{error:#}")).unwrap_or_default();
    assert!(
        error.contains("[[cron]] job `daily`: model = \"big\" names no [models.big] entry; defined: none"),
        "{error}"
    );
    let config = parse(&format!("[models.big]\nprovider = \"openai\"\nmodel = \"m\"\n{job}"));
    assert_eq!(config.cron[0].config.model.as_deref(), Some("big"));
}

#[test]
fn a_cron_output_schema_is_a_table_read_as_a_json_schema_object() {
    let job = "[[cron]]\nname = \"daily\"\nschedule = \"@daily\"\nprompt = \"report\"\nchannel = \"ops\"\n";
    let config = parse(&format!(
        "{job}[cron.output_schema]\ntype = \"object\"\nrequired = [\"ok\"]\nproperties = {{ ok = {{ type = \"boolean\" }} }}\n"
    ));
    assert_eq!(
        config.cron[0].config.output_schema,
        Some(serde_json::json!({"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}))
    );
    let error = Config::parse(Path::new(PATH), &format!("{job}output_schema = \"boolean\"\n"))
        .err()
        .map(|error| format!("{error:#}"))
        .unwrap_or_default();
    assert!(
        error.contains("[[cron]]")
            && error.contains("output_schema must be a JSON Schema object")
            && error.contains("write it as a table"),
        "{error}"
    );
}

fn load_error(text: &str) -> String {
    Config::parse(Path::new(PATH), text).err().map(|error| format!("{error:#}")).unwrap_or_default()
}

#[test]
fn agents_entries_are_checked_at_load_naming_the_entry() {
    let ana = "[[agents]]\nname = \"Ana\"\nchannels = [\"api:room\"]\n";
    let config =
        parse(&format!("{ana}[[agents]]\nname = \"Ben\"\nchannels = [\"discord:*\"]\ntools = [\"read_file\"]\n"));
    assert_eq!(config.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["Ana", "Ben"]);
    let cases = [
        (
            "[[agents]]\nname = \"Ana Bell\"\nchannels = [\"api\"]\n".to_owned(),
            "[[agents]] entry 1 (name = \"Ana Bell\"): a name is one word",
        ),
        (
            format!("{ana}[[agents]]\nname = \"ana\"\nchannels = [\"api\"]\n"),
            "[[agents]] entry 2 (name = \"ana\"): another",
        ),
        ("[[agents]]\nname = \"Kesoku\"\nchannels = [\"api\"]\n".to_owned(), "the name is [agent] name's"),
        (
            "[[agents]]\nname = \"Ana\"\nchannels = [\"api\"]\nmodel = \"big\"\n".to_owned(),
            "model = \"big\" names no [models.big] entry",
        ),
        ("[[agents]]\nname = \"Ana\"\n".to_owned(), "[[agents]] entry 1 (name = \"Ana\"): channels is empty"),
        ("[[agents]]\nname = \"Ana\"\nchannels = [\":room\"]\n".to_owned(), "channels entry \":room\""),
        (
            "[[agents]]\nname = \"Ana\"\nchannels = [\"api\"]\nintro = \"x\"\nintro_file = \"a.md\"\n".to_owned(),
            "give `intro` or `intro_file`, not both",
        ),
        ("[[agents]]\nname = \"Ana\"\nchannels = [\"api\"]\ncolour = \"red\"\n".to_owned(), "unknown field `colour`"),
    ];
    for (text, expected) in cases {
        let error = load_error(&text);
        assert!(error.contains(expected), "`{text}` gave: {error}");
    }
}

#[test]
fn an_agents_tool_that_is_not_configured_is_refused_naming_the_known_ones() {
    let config = parse("[[agents]]\nname = \"Ana\"\nchannels = [\"api\"]\ntools = [\"read_file\", \"reed_file\"]\n");
    let known = ["read_file", "write_file"];
    let error =
        super::check_agent_tools(&config.agents, known.into_iter()).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(
        error.contains(
            "[[agents]] entry 1 (name = \"Ana\"): tools names `reed_file`, which is not a tool of this configuration; \
             known tools: read_file, write_file"
        ),
        "{error}"
    );
    let fine = parse("[[agents]]\nname = \"Ana\"\nchannels = [\"api\"]\ntools = [\"read_file\"]\n");
    assert!(super::check_agent_tools(&fine.agents, known.into_iter()).is_ok());
}

/// `deploy/kesoku.toml`, the config every process of `deploy/compose.yaml` reads, loads with the
/// keys the README documents: Redis shared, PostgreSQL pooled, the API open to the network
/// behind a token.
#[test]
fn the_deployment_example_config_loads() {
    let config = Config::parse(Path::new("/etc/kesoku/kesoku.toml"), include_str!("../../../../deploy/kesoku.toml"))
        .unwrap_or_else(|error| panic!("deploy/kesoku.toml: {error:#}"));
    let redis = config.broker.redis().expect("the deployment shares a redis");
    assert_eq!((redis.url.as_str(), redis.prefix.as_str()), ("redis://redis:6379", "kesoku"));
    assert!(config.database_url.starts_with("postgres://kesoku@postgres:5432/"), "{}", config.database_url);
    assert_eq!(config.database.pool(), kesoku_store::PgPoolSettings::default(), "the example spells out the defaults");
    let http = config.http.as_ref().expect("the ingest serves the api");
    assert_eq!(http.token_env.as_deref(), Some("KESOKU_HTTP_TOKEN"));
}
