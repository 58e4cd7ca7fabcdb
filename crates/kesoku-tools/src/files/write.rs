//! `write_file`: create a text file or replace all of its content.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{WRITE_FILE, effective, on_blocking_thread};
use crate::config::FilesConfig;
use crate::tool::{Tool, ToolContext, ToolOutput, ToolSpec, parse_arguments};

/// The `write_file` tool.
pub struct WriteFileTool {
    spec: ToolSpec,
    config: FilesConfig,
}

#[derive(Deserialize)]
struct WriteParams {
    path: String,
    content: String,
}

impl WriteFileTool {
    pub fn new(config: &FilesConfig) -> Self {
        let config = effective(config);
        let spec = ToolSpec {
            name: WRITE_FILE.to_owned(),
            description: "Create a text file inside the workspace (or this session's staging folder), or replace \
                          all of an existing file's content. Missing parent folders are created. To change part \
                          of a file, use edit_file."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path of the file, relative to the workspace."},
                    "content": {"type": "string", "description": "The whole new content of the file."}
                },
                "required": ["path", "content"]
            }),
        };
        Self { spec, config }
    }
}

#[async_trait]
impl Tool for WriteFileTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: WriteParams = match parse_arguments(WRITE_FILE, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let raw = params.path;
        let size = params.content.len();
        if size > self.config.max_file_bytes {
            return ToolOutput::failure(format!(
                "the content is {size} bytes, more than the {} bytes write_file accepts \
                 (tools.files.max_file_bytes); write the file in parts with run_shell_command or ask the user",
                self.config.max_file_bytes
            ));
        }
        let content = params.content;
        let created = on_blocking_thread(ctx, &raw, move |target, raw| {
            target.reject_folder(raw)?;
            if !target.exists()
                && let Some(parent) = target.path.parent()
            {
                std::fs::create_dir_all(parent).map_err(|error| {
                    ToolOutput::failure(format!("could not create the folders of `{raw}`: {error}"))
                })?;
            }
            std::fs::write(&target.path, content.as_bytes())
                .map_err(|error| ToolOutput::failure(format!("could not write `{raw}`: {error}")))?;
            Ok(!target.exists())
        })
        .await;
        let what = match created {
            Ok(true) => "created",
            Ok(false) => "replaced the content of",
            Err(output) => return output,
        };
        let message = format!("{what} `{raw}` ({size} bytes)");
        ToolOutput::success(message.clone()).with_summary(message)
    }
}
