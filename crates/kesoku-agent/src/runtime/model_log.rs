//! The per-session model log (debug mode): each model call's request and answer, one JSON line
//! per call, in `model-log.jsonl` of the session's staging folder.

use std::path::Path;

use chrono::Utc;
use kesoku_llm::{LlmError, Request, Response};
use serde_json::json;

/// Append one model call to `model-log.jsonl` in the staging folder (debug mode). Requests hold
/// no credentials: keys live only inside the providers' HTTP clients.
pub(super) fn write_model_log(dir: &Path, step: u32, request: &Request, response: Result<&Response, &LlmError>) {
    let entry = json!({
        "at": Utc::now().to_rfc3339(),
        "step": step,
        "request": request,
        "response": response.ok(),
        "error": response.err().map(|e| e.to_string()),
    });
    let line = format!("{entry}\n");
    let path = dir.join("model-log.jsonl");
    let result = std::fs::create_dir_all(dir).and_then(|()| {
        use std::io::Write;
        std::fs::OpenOptions::new().create(true).append(true).open(&path)?.write_all(line.as_bytes())
    });
    if let Err(error) = result {
        tracing::warn!(%error, "could not write the model log");
    }
}
