//! `kesoku models`: list configured models and check one with a tiny request.

use std::process::ExitCode;

use crate::cli::ModelsCommand;
use crate::config::{Config, ModelEntry};
use crate::wiring;

pub async fn run(config: &Config, command: ModelsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ModelsCommand::List => {
            if config.models.is_empty() {
                println!("no models configured in {}", config.path.display());
            }
            for (name, entry) in &config.models {
                match entry {
                    ModelEntry::Remote(model) => {
                        println!("{name}  {}  {}  {}", model.provider, model.model, model.effective_base_url())
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ModelsCommand::Check { name } => {
            let model = wiring::build_model(config, &name)?;
            match kesoku_llm::check(model.as_ref()).await {
                Ok(report) => {
                    println!(
                        "{name}: ok, first event after {:.0} ms, complete after {:.0} ms",
                        report.first_event_latency.as_secs_f64() * 1000.0,
                        report.total_latency.as_secs_f64() * 1000.0
                    );
                    println!(
                        "usage: {} input, {} output tokens",
                        report.usage.input_tokens, report.usage.output_tokens
                    );
                    println!("answer: {}", report.reply.trim());
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("{name}: {error}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
