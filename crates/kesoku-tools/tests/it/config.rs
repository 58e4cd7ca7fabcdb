//! The `[tools]` section: defaults, parsing, and the checks of `validate`.

use kesoku_tools::{PolicyMode, ToolsConfig, ToolsConfigError};
use serde::{Deserialize, Serialize};

use crate::support::TestResult;

/// The part of `kesoku.toml` this crate owns.
#[derive(Serialize, Deserialize)]
struct KesokuToml {
    #[serde(default)]
    tools: ToolsConfig,
}

fn parse(text: &str) -> Result<ToolsConfig, toml::de::Error> {
    toml::from_str::<KesokuToml>(text).map(|file| file.tools)
}

#[test]
fn the_defaults_written_out() -> TestResult {
    let defaults = ToolsConfig::default();
    let written = toml::to_string(&KesokuToml { tools: defaults.clone() })?;
    insta::assert_snapshot!("default_tools_config", written);
    assert_eq!(defaults.validate(), Ok(()));
    // The written defaults read back as the defaults.
    assert_eq!(parse(&written)?, defaults);
    Ok(())
}

#[test]
fn an_absent_section_means_the_defaults() -> TestResult {
    assert_eq!(parse("")?, ToolsConfig::default());
    Ok(())
}

#[test]
fn a_section_overrides_only_what_it_names() -> TestResult {
    let config = parse(
        r#"
        [tools]
        max_concurrent_processes = 2
        disabled = ["write_file"]

        [tools.shell]
        mode = "allowlist"
        allowlist_patterns = ['git (status|diff)( .*)?', 'cargo test( .*)?']
        env_set = { PAGER = "cat" }

        [tools.files]
        max_read_chars = 2000
        "#,
    )?;
    assert_eq!(config.max_concurrent_processes, 2);
    assert_eq!(config.disabled, ["write_file"]);
    assert_eq!(config.shell.mode, PolicyMode::Allowlist);
    let allowed: Vec<&str> = config.shell.allowlist_patterns.iter().map(|pattern| pattern.as_str()).collect();
    assert_eq!(allowed, ["git (status|diff)( .*)?", "cargo test( .*)?"]);
    assert!(config.shell.allowlist_patterns[0].matches_whole("git diff --stat"));
    assert_eq!(config.shell.env_set.get("PAGER").map(String::as_str), Some("cat"));
    assert_eq!(config.shell.default_timeout_s, 120, "unnamed settings keep their defaults");
    assert_eq!(config.shell.blocklist_patterns, ToolsConfig::default().shell.blocklist_patterns);
    assert_eq!(config.files.max_read_chars, 2000);
    assert_eq!(config.validate(), Ok(()));
    Ok(())
}

#[test]
fn typos_and_bad_patterns_are_parse_errors() {
    let error = parse("[tools.shell]\ntimeout = 5\n").map(|_| ()).map_err(|error| error.to_string());
    assert!(error.as_ref().is_err_and(|error| error.contains("unknown field `timeout`")), "{error:?}");

    let error = parse("[tools.shell]\nblocklist_patterns = ['rm (']\n").map(|_| ()).map_err(|error| error.to_string());
    assert!(error.as_ref().is_err_and(|error| error.contains("invalid regular expression `rm (`")), "{error:?}");

    let error = parse("[tools.shell]\nmode = \"denylist\"\n").map(|_| ()).map_err(|error| error.to_string());
    assert!(error.is_err());
}

#[test]
fn validate_reports_settings_that_cannot_work() {
    let check = |adjust: fn(&mut ToolsConfig)| {
        let mut config = ToolsConfig::default();
        adjust(&mut config);
        config.validate().map_err(|error| error.to_string())
    };
    assert_eq!(
        check(|config| config.disabled = vec!["run_shel_command".to_owned()]),
        Err(ToolsConfigError::UnknownTool {
            name: "run_shel_command".to_owned(),
            known: "run_shell_command, read_file, write_file, edit_file".to_owned()
        }
        .to_string())
    );
    assert_eq!(
        check(|config| config.max_concurrent_processes = 0),
        Err("tools.max_concurrent_processes is invalid: must be at least 1".to_owned())
    );
    assert_eq!(
        check(|config| config.shell.default_timeout_s = 601),
        Err("tools.shell.default_timeout_s is invalid: must be between 1 and shell.max_timeout_s".to_owned())
    );
    assert!(check(|config| config.shell.max_output_chars = 100).is_err());
    assert!(check(|config| config.shell.env_allowlist.push("*".to_owned())).is_err());
    assert!(
        check(|config| config.shell.mode = PolicyMode::Allowlist)
            .is_err_and(|error| error.contains("refuses every command"))
    );
}
