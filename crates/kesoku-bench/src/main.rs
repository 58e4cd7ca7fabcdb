//! `kesoku-bench`: run the benchmarks and print the results table (Markdown) for
//! `docs/BENCHMARKS.md`.
//!
//! ```text
//! cargo build --release -p kesoku -p kesoku-bench
//! cargo run -p kesoku-bench --release -- [--postgres URL] [--quick] [--only overhead,throughput,…]
//! ```

use std::process::ExitCode;

use clap::Parser;

/// The `kesoku` binary's allocator (mimalloc, counting live bytes), so in-process measurements
/// match the service.
#[global_allocator]
static ALLOCATOR: kesoku_alloc::Allocator = kesoku_alloc::Allocator;
use kesoku_bench::bench::{self, Row, Scale};
use kesoku_bench::system::Backend;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "kesoku-bench",
    about = "Measure Kesoku: turn overhead, throughput, memory, start-up, history, lanes."
)]
struct Args {
    /// Also run the store measurements on PostgreSQL (each run in a schema of its own).
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// With --postgres: also run the scale-out measurement (`cluster`: 1, 2 and 4 worker
    /// processes on PostgreSQL + this Redis, beside the embedded default).
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// A short run (seconds per measurement) instead of the full one.
    #[arg(long)]
    quick: bool,
    /// Only these measurements (comma separated): overhead, throughput, history, lanes, startup,
    /// memory, first-answer, cluster.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Minutes of the memory soak (default: 1 with --quick, 10 otherwise).
    #[arg(long)]
    soak_minutes: Option<f64>,
    /// Also write the memory soak's samples (every 5 s: RSS, anonymous, live heap, SQLite,
    /// history cache, rest, the listeners' duplicate-filter ids and table bytes) to this CSV file as
    /// they are taken.
    #[arg(long, value_name = "FILE")]
    soak_samples: Option<std::path::PathBuf>,
    /// The local model file for first-answer (default: `$KESOKU_TEST_LOCAL_MODEL`, else
    /// `~/.cache/kesoku-models/SmolLM2-135M-Instruct.Q4_1.gguf`).
    #[arg(long, value_name = "FILE")]
    local_model: Option<std::path::PathBuf>,
    /// Also write the rows as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
}

impl Args {
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }
}

fn main() -> ExitCode {
    kesoku_alloc::configure();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KESOKU_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Measured work runs in a task of the runtime, as a chatbot adapter does in the service;
    // `block_on`'s own future runs on this (main) thread, outside the runtime's workers, and
    // every wake-up between it and a worker would cross threads.
    let spawned = args.clone();
    let outcome = runtime.block_on(async move {
        match tokio::spawn(async move { run(&spawned).await }).await {
            Ok(outcome) => outcome,
            Err(join_error) => Err(anyhow::anyhow!("the benchmark task failed: {join_error}")),
        }
    });
    match outcome {
        Ok(rows) => {
            print_table(&rows);
            if let Some(path) = &args.json {
                let text = serde_json::to_string_pretty(&rows).unwrap_or_default();
                if let Err(error) = std::fs::write(path, text) {
                    eprintln!("error: cannot write {}: {error}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<Vec<Row>> {
    let scale = if args.quick { Scale::Quick } else { Scale::Full };
    let mut backends = vec![Backend::Sqlite];
    if let Some(url) = &args.postgres {
        backends.push(Backend::Postgres(url.clone()));
    }
    let mut rows = Vec::new();
    for backend in &backends {
        if args.wants("overhead") {
            eprintln!("overhead per turn on {} …", backend.label());
            let measured = bench::overhead::run(backend, scale).await?;
            rows.extend(bench::overhead::rows(backend, &measured));
        }
        if args.wants("throughput") {
            eprintln!("throughput on {} …", backend.label());
            let (measured, store_only) = bench::throughput::run(backend, scale).await?;
            rows.extend(bench::throughput::rows(backend, &measured, &store_only));
        }
        if args.wants("history") {
            eprintln!("history on {} …", backend.label());
            let measured = bench::history::run(backend, scale).await?;
            rows.extend(bench::history::rows(backend, &measured));
        }
        if args.wants("lanes") {
            eprintln!("lanes on {} …", backend.label());
            let measured = bench::lanes::run(backend, scale).await?;
            rows.extend(bench::lanes::rows(backend, &measured));
        }
    }
    if args.wants("cluster") {
        match (&args.postgres, &args.redis) {
            (Some(postgres), Some(redis)) => {
                eprintln!("scale-out (processes on PostgreSQL + Redis) …");
                let binary = bench::cluster::binary()?;
                let (measured, ingest) = bench::cluster::run(&binary, postgres, redis, scale).await?;
                rows.extend(bench::cluster::rows(&measured, &ingest));
            }
            _ if args.only.iter().any(|o| o == "cluster") => {
                anyhow::bail!("the scale-out measurement needs --postgres URL and --redis URL")
            }
            _ => {}
        }
    }
    if args.wants("startup") || args.wants("memory") || args.wants("first-answer") {
        let Some(binary) = kesoku_bench::binaries::sibling("kesoku") else {
            anyhow::bail!(
                "start-up and memory measure the real `kesoku` binary, which is not built next to this one: \
                 run `cargo build --release -p kesoku` first (or pass --only overhead,throughput,history,lanes)"
            );
        };
        if args.wants("startup") {
            eprintln!("start-up of {} …", binary.display());
            let measured = bench::startup::run(&binary, scale).await?;
            rows.extend(bench::startup::rows(&measured));
        }
        if args.wants("memory") {
            let minutes = args.soak_minutes.unwrap_or(if args.quick { 1.0 } else { 10.0 });
            eprintln!("memory of `kesoku start` ({minutes} min soak) …");
            let measured = bench::memory::run(&binary, scale, minutes, args.soak_samples.as_deref()).await?;
            rows.extend(bench::memory::rows(&measured));
        }
        if args.wants("first-answer") {
            match bench::first_answer::find_model(args.local_model.as_deref()) {
                Some(model) => {
                    eprintln!("first answer of the embedded default ({}) …", model.display());
                    let measured = bench::first_answer::run(&binary, &model, scale).await?;
                    rows.extend(bench::first_answer::rows(&measured));
                }
                None if args.only.is_empty() => eprintln!(
                    "skipped first-answer: no local model file (pass --local-model, or run `kesoku models pull \
                     smollm2 --dir ~/.cache/kesoku-models`)"
                ),
                None => anyhow::bail!(
                    "first-answer needs the local model file: pass --local-model FILE, or run `kesoku models pull \
                     smollm2 --dir ~/.cache/kesoku-models`"
                ),
            }
        }
    }
    Ok(rows)
}

fn print_table(rows: &[Row]) {
    // Figures are machine-specific: every table names the CPU it ran on.
    println!("Machine: {}\n", kesoku_bench::procfs::machine());
    println!("| measure | store | result | target | verdict | details |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.measure,
            row.backend,
            row.value,
            row.target,
            row.verdict.label(),
            row.note
        );
    }
}
