//! Chat once with a local GGUF model from the command line, streaming the answer.
//!
//! `cargo run -p kesoku-local --example local_chat -- MODEL.gguf "What is 25 + 15?"`

use futures::StreamExt;
use kesoku_local::{ChatMessage, ChatPrompt, GenerationEvent, LocalModel, LocalModelConfig};
use std::io::Write;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(question)) = (args.next(), args.next()) else {
        return Err("usage: local_chat MODEL.gguf QUESTION".into());
    };
    let mut config = LocalModelConfig::new(path);
    config.temperature = 0.0;
    let model = LocalModel::load_async(&config).await?;
    eprintln!("{:?}", model.info());
    let prompt = ChatPrompt { messages: vec![ChatMessage::user(question)], tools: Vec::new() };
    eprintln!("--- prompt ---\n{}\n--------------", model.render_prompt(&prompt)?);
    let mut generation = model.chat(&prompt, model.default_params(), &CancellationToken::new())?;
    while let Some(event) = generation.next().await {
        match event? {
            GenerationEvent::Text(piece) => {
                print!("{piece}");
                std::io::stdout().flush()?;
            }
            GenerationEvent::Finished(stats) => {
                println!();
                eprintln!(
                    "{stats:?}\nprompt {:.1} tokens/s, generation {:.1} tokens/s",
                    stats.prompt_tokens_per_second(),
                    stats.generation_tokens_per_second()
                );
            }
        }
    }
    Ok(())
}
