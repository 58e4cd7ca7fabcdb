//! `kesoku service install|uninstall|start|stop|status|logs`: the service as a systemd unit.
//!
//! The unit runs `kesoku --config <absolute config> --log-format json start` in the config's
//! folder and restarts it on failure. Stopping sends SIGTERM to the service alone
//! (`KillMode=mixed`: tools it runs are stopped by the service itself within its grace period),
//! and systemd waits the grace period plus a margin before it kills anything.
//!
//! Secrets never go into the unit: it names an environment file (`EnvironmentFile=`), by
//! default `kesoku.env` beside the config, which `install` creates with mode 0600 and an empty
//! line per variable the config names (`api_key_env` of each model) for the user to fill in.
//! An existing file readable by others is tightened to 0600. `--dry-run` prints the unit and
//! the commands and changes nothing.
//!
//! User units (`~/.config/systemd/user`, the default) run while the user is logged in unless
//! lingering is enabled (`loginctl enable-linger`); system units (`--system`) need root.

use std::fmt::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::cli::{ServiceCommand, UnitArgs};
use crate::config::{Config, ModelEntry};

/// Seconds systemd waits beyond the grace period before it kills the service.
const STOP_MARGIN_S: u64 = 20;

pub async fn run(config: &Config, command: ServiceCommand) -> anyhow::Result<ExitCode> {
    match command {
        ServiceCommand::Install { unit, env_file, user, dry_run } => {
            install(config, &unit, env_file.as_deref(), user, dry_run)
        }
        ServiceCommand::Uninstall { unit, dry_run } => uninstall(&unit, dry_run),
        ServiceCommand::Start(unit) => systemctl(&unit, &["start"]),
        ServiceCommand::Stop(unit) => systemctl(&unit, &["stop"]),
        ServiceCommand::Status(unit) => systemctl(&unit, &["status", "--no-pager"]),
        ServiceCommand::Logs { unit, follow, lines } => {
            let mut args: Vec<String> = Vec::new();
            if unit.system {
                args.extend(["-u".to_owned(), unit_file_name(&unit)]);
            } else {
                args.extend(["--user-unit".to_owned(), unit_file_name(&unit)]);
            }
            args.extend(["-n".to_owned(), lines.to_string(), "--no-pager".to_owned()]);
            if follow {
                args.push("-f".to_owned());
            }
            run_tool("journalctl", &args)
        }
    }
}

/// Everything a unit file is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    pub description: String,
    pub binary: PathBuf,
    pub config: PathBuf,
    pub working_dir: PathBuf,
    pub env_file: PathBuf,
    /// System units: the account the service runs as.
    pub user: Option<String>,
    pub system: bool,
    pub grace_s: u64,
}

/// The unit file's text.
pub fn unit_text(spec: &UnitSpec) -> String {
    let mut unit = String::new();
    let _ = writeln!(unit, "# Written by `kesoku service install`. Secrets are not in this file: they are read");
    let _ = writeln!(unit, "# from the EnvironmentFile below (mode 0600).");
    let _ = writeln!(unit, "[Unit]");
    let _ = writeln!(unit, "Description={}", spec.description);
    let _ = writeln!(unit, "After=network-online.target");
    let _ = writeln!(unit, "Wants=network-online.target");
    let _ = writeln!(unit);
    let _ = writeln!(unit, "[Service]");
    let _ = writeln!(unit, "Type=exec");
    let _ = writeln!(
        unit,
        "ExecStart={} --config {} --log-format json start",
        exec_quote(&spec.binary),
        exec_quote(&spec.config)
    );
    let _ = writeln!(unit, "WorkingDirectory={}", spec.working_dir.display());
    let _ = writeln!(unit, "EnvironmentFile={}", spec.env_file.display());
    if let Some(user) = &spec.user {
        let _ = writeln!(unit, "User={user}");
    }
    let _ = writeln!(unit, "Restart=on-failure");
    let _ = writeln!(unit, "RestartSec=5");
    let _ = writeln!(unit, "KillSignal=SIGTERM");
    let _ = writeln!(unit, "KillMode=mixed");
    let _ = writeln!(unit, "TimeoutStopSec={}", spec.grace_s + STOP_MARGIN_S);
    let _ = writeln!(unit, "UMask=0077");
    let _ = writeln!(unit, "NoNewPrivileges=true");
    let _ = writeln!(unit);
    let _ = writeln!(unit, "[Install]");
    let _ = writeln!(unit, "WantedBy={}", if spec.system { "multi-user.target" } else { "default.target" });
    unit
}

/// A path as one `ExecStart=` word (quoted when it holds spaces or quotes).
fn exec_quote(path: &Path) -> String {
    let text = path.display().to_string();
    if text.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\') {
        format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        text
    }
}

fn unit_file_name(unit: &UnitArgs) -> String {
    format!("{}.service", unit.name)
}

/// Where the unit file goes.
fn unit_path(unit: &UnitArgs) -> anyhow::Result<PathBuf> {
    if unit.system {
        return Ok(PathBuf::from("/etc/systemd/system").join(unit_file_name(unit)));
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => bail!("neither XDG_CONFIG_HOME nor HOME is set: cannot find the user's systemd folder"),
        },
    };
    Ok(base.join("systemd").join("user").join(unit_file_name(unit)))
}

/// The environment variables the config names for secrets, sorted, without duplicates.
fn secret_variables(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config
        .models
        .values()
        .filter_map(|entry| match entry {
            ModelEntry::Remote(model) => model.effective_api_key_env(),
            ModelEntry::Local(_) => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    if let Ok(canonical) = path.canonicalize() {
        return Ok(canonical);
    }
    if path.is_absolute() {
        return Ok(path.to_owned());
    }
    Ok(std::env::current_dir().context("reading the current folder")?.join(path))
}

fn install(
    config: &Config,
    unit: &UnitArgs,
    env_file: Option<&Path>,
    user: Option<String>,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    let config_path = absolute(&config.path)?;
    let working_dir = config_path.parent().map_or_else(|| PathBuf::from("/"), Path::to_owned);
    let env_file = match env_file {
        Some(path) => absolute(path)?,
        None => working_dir.join("kesoku.env"),
    };
    let binary = std::env::current_exe().context("finding the kesoku binary")?;
    let binary = binary.canonicalize().unwrap_or(binary);
    let user = if unit.system {
        user.or_else(|| std::env::var("SUDO_USER").ok())
            .or_else(|| std::env::var("USER").ok())
            .filter(|name| !name.is_empty() && name != "root")
    } else {
        if user.is_some() {
            bail!("--user only applies to system units (--system): a user unit runs as its user");
        }
        None
    };
    let spec = UnitSpec {
        description: format!("Kesoku agent runtime ({})", config_path.display()),
        binary,
        config: config_path,
        working_dir,
        env_file: env_file.clone(),
        user,
        system: unit.system,
        grace_s: config.service.shutdown_grace_s,
    };
    let text = unit_text(&spec);
    let path = unit_path(unit)?;
    let variables = secret_variables(config);
    let scope: &[&str] = if unit.system { &[] } else { &["--user"] };
    let file_name = unit_file_name(unit);
    let commands = [[scope, &["daemon-reload"]].concat(), [scope, &["enable", file_name.as_str()]].concat()];

    if dry_run {
        println!("# unit file: {}", path.display());
        print!("{text}");
        println!();
        println!("# environment file: {}", env_file.display());
        match std::fs::metadata(&env_file) {
            Ok(meta) => println!("#   exists, mode {:04o}", meta.permissions().mode() & 0o7777),
            Err(_) => println!("#   would be created with mode 0600"),
        }
        if variables.is_empty() {
            println!("#   the config names no secret variables");
        } else {
            println!("#   variables the config names: {}", variables.join(", "));
        }
        for args in &commands {
            println!("# would run: systemctl {}", args.join(" "));
        }
        return Ok(ExitCode::SUCCESS);
    }

    prepare_env_file(&env_file, &variables)?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&path, &text).with_context(|| format!("writing the unit file {}", path.display()))?;
    println!("wrote {}", path.display());
    for args in &commands {
        let code = run_tool("systemctl", args)?;
        if code != ExitCode::SUCCESS {
            bail!("`systemctl {}` failed (see its message above)", args.join(" "));
        }
    }
    let scope_flag = if unit.system { " --system" } else { "" };
    println!(
        "installed {}: fill in {} then run `kesoku service start{scope_flag}`",
        unit_file_name(unit),
        env_file.display()
    );
    if !unit.system {
        println!("to keep it running after you log out: loginctl enable-linger");
    }
    Ok(ExitCode::SUCCESS)
}

/// Create the environment file (mode 0600, one empty entry per variable), or make sure an
/// existing one is private.
fn prepare_env_file(path: &Path, variables: &[String]) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o077 != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("making {} private", path.display()))?;
                println!("{} was readable by others (mode {mode:04o}): it is now 0600", path.display());
            }
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let missing: Vec<&String> = variables
                .iter()
                .filter(|name| !text.lines().any(|line| line.trim_start().starts_with(&format!("{name}="))))
                .collect();
            if !missing.is_empty() {
                println!(
                    "{} does not set {}: add them before starting",
                    path.display(),
                    missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                );
            }
        }
        Err(_) => {
            let mut text = String::from(
                "# Secrets for the kesoku service (read by systemd through EnvironmentFile=).\n\
                 # Keep this file private (mode 0600). One VARIABLE=value per line.\n",
            );
            for name in variables {
                let _ = writeln!(text, "{name}=");
            }
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.write_all(text.as_bytes())?;
            println!("created {} (mode 0600)", path.display());
        }
    }
    Ok(())
}

fn uninstall(unit: &UnitArgs, dry_run: bool) -> anyhow::Result<ExitCode> {
    let path = unit_path(unit)?;
    let scope: &[&str] = if unit.system { &[] } else { &["--user"] };
    let file_name = unit_file_name(unit);
    let disable = [scope, &["disable", "--now", file_name.as_str()]].concat();
    let reload = [scope, &["daemon-reload"]].concat();
    if dry_run {
        println!("# would run: systemctl {}", disable.join(" "));
        println!("# would remove: {}", path.display());
        println!("# would run: systemctl {}", reload.join(" "));
        return Ok(ExitCode::SUCCESS);
    }
    if !path.exists() {
        bail!("{} is not installed ({} does not exist)", unit_file_name(unit), path.display());
    }
    // Disabling fails when the unit was never enabled; removing the file still uninstalls it.
    let _ = run_tool("systemctl", &disable)?;
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    println!("removed {}", path.display());
    run_tool("systemctl", &reload)
}

fn systemctl(unit: &UnitArgs, action: &[&str]) -> anyhow::Result<ExitCode> {
    let mut args: Vec<String> = Vec::new();
    if !unit.system {
        args.push("--user".to_owned());
    }
    args.extend(action.iter().map(|s| (*s).to_owned()));
    args.push(unit_file_name(unit));
    run_tool("systemctl", &args)
}

/// Run a systemd tool with the terminal attached; its exit status becomes ours.
fn run_tool<S: AsRef<std::ffi::OsStr>>(tool: &str, args: &[S]) -> anyhow::Result<ExitCode> {
    let status = match std::process::Command::new(tool).args(args).status() {
        Ok(status) => status,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "`{tool}` was not found: `kesoku service` needs systemd (run `kesoku start` under another supervisor)"
            )
        }
        Err(error) => return Err(error).with_context(|| format!("running {tool}")),
    };
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_file_is_created_private_and_an_open_one_is_tightened() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kesoku.env");
        prepare_env_file(&path, &["OPENAI_API_KEY".to_owned()])?;
        assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&path)?.lines().any(|line| line == "OPENAI_API_KEY="));

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        prepare_env_file(&path, &["OPENAI_API_KEY".to_owned()])?;
        assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
        Ok(())
    }

    #[test]
    fn paths_with_spaces_are_quoted_in_exec_start() {
        assert_eq!(exec_quote(Path::new("/opt/kesoku/bin/kesoku")), "/opt/kesoku/bin/kesoku");
        assert_eq!(exec_quote(Path::new("/home/a b/kesoku.toml")), "\"/home/a b/kesoku.toml\"");
    }
}
