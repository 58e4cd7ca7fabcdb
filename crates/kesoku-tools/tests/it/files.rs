//! `read_file`, `write_file`, `edit_file`: behaviour, limits and confinement.

use std::os::unix::fs::symlink;

use kesoku_tools::{
    EDIT_FILE, FilesConfig, READ_FILE, Registry, ToolOutput, ToolsConfig, WRITE_FILE, builtin_registry,
};
use serde_json::{Value, json};

use crate::support::{Fixture, TestResult};

async fn call(fixture: &Fixture, tool: &str, arguments: Value) -> ToolOutput {
    builtin_registry(&ToolsConfig::default()).call(tool, &fixture.ctx, arguments).await
}

fn error_of(output: &ToolOutput) -> &str {
    output.error.as_deref().unwrap_or_default()
}

// --- read_file --------------------------------------------------------------------------------

#[tokio::test]
async fn read_file_returns_the_text_exactly() -> TestResult {
    let fixture = Fixture::new()?;
    fixture.write("src/lib.rs", "fn main() {\r\n    println!(\"hé\");\r\n}")?;
    let output = call(&fixture, READ_FILE, json!({ "path": "src/lib.rs" })).await;
    assert_eq!(output.error, None);
    assert_eq!(output.content, "fn main() {\r\n    println!(\"hé\");\r\n}");
    assert_eq!(output.summary.as_deref(), Some("read 3 lines of `src/lib.rs`"));

    fixture.write("empty.txt", "")?;
    let output = call(&fixture, READ_FILE, json!({ "path": "empty.txt" })).await;
    assert_eq!(output.content, "[the file is empty]");
    Ok(())
}

#[tokio::test]
async fn read_file_reads_a_window_of_lines() -> TestResult {
    let fixture = Fixture::new()?;
    let text: String = (1..=10).map(|n| format!("line {n}\n")).collect();
    fixture.write("ten.txt", &text)?;

    let output = call(&fixture, READ_FILE, json!({ "path": "ten.txt", "offset": 3, "limit": 2 })).await;
    assert_eq!(
        output.content,
        "line 3\nline 4\n\n[lines 3-4 of `ten.txt`; more lines follow: call read_file with offset=5 to continue]"
    );
    let output = call(&fixture, READ_FILE, json!({ "path": "ten.txt", "offset": 9 })).await;
    assert_eq!(output.content, "line 9\nline 10\n\n[lines 9-10 of `ten.txt`; this is the end of the file]");
    let output = call(&fixture, READ_FILE, json!({ "path": "ten.txt", "offset": 11 })).await;
    assert_eq!(
        error_of(&output),
        "`ten.txt` has 10 lines, so there is nothing from line 11 on; use a smaller `offset`"
    );
    let output = call(&fixture, READ_FILE, json!({ "path": "ten.txt", "offset": 0 })).await;
    assert_eq!(error_of(&output), "invalid arguments for tool `read_file`: `offset`: must be at least 1, got 0");
    Ok(())
}

#[tokio::test]
async fn read_file_stops_at_its_character_budget() -> TestResult {
    let fixture = Fixture::new()?;
    // 2,000 lines of 50 characters: 100,000 characters, twice the default budget.
    let line = format!("{}\n", "x".repeat(49));
    fixture.write("big.txt", &line.repeat(2_000))?;
    let output = call(&fixture, READ_FILE, json!({ "path": "big.txt" })).await;
    assert_eq!(output.error, None);
    assert!(output.content.starts_with(&line.repeat(1_000)));
    assert!(
        output
            .content
            .ends_with("\n[lines 1-1000 of `big.txt`; more lines follow: call read_file with offset=1001 to continue]"),
        "{}",
        &output.content[output.content.len() - 200..]
    );

    // One line longer than the budget: its start is shown.
    let registry = builtin_registry(&ToolsConfig {
        files: FilesConfig { max_read_chars: 1_000, ..FilesConfig::default() },
        ..ToolsConfig::default()
    });
    fixture.write("minified.js", &format!("{}\nnext\n", "y".repeat(1_000_000)))?;
    let output = registry.call(READ_FILE, &fixture.ctx, json!({ "path": "minified.js" })).await;
    assert_eq!(
        output.content,
        format!(
            "{}\n\n[line 1 is longer than 1000 characters; only its start is shown; more lines follow: call read_file with offset=2 to continue]",
            "y".repeat(1_000)
        )
    );
    Ok(())
}

#[tokio::test]
async fn read_file_refuses_what_is_not_a_text_file() -> TestResult {
    let fixture = Fixture::new()?;
    std::fs::write(fixture.path("image.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")?;
    let output = call(&fixture, READ_FILE, json!({ "path": "image.png" })).await;
    assert!(error_of(&output).starts_with("`image.png` looks like a binary file"), "{}", error_of(&output));

    std::fs::create_dir(fixture.path("src"))?;
    let output = call(&fixture, READ_FILE, json!({ "path": "src" })).await;
    assert!(error_of(&output).starts_with("`src` is a folder, not a file"));

    let output = call(&fixture, READ_FILE, json!({ "path": "nope.txt" })).await;
    assert_eq!(error_of(&output), "file `nope.txt` does not exist");
    Ok(())
}

// --- write_file -------------------------------------------------------------------------------

#[tokio::test]
async fn write_file_creates_folders_and_replaces_content() -> TestResult {
    let fixture = Fixture::new()?;
    let output = call(&fixture, WRITE_FILE, json!({ "path": "a/b/c.txt", "content": "one\n" })).await;
    assert_eq!(output.content, "created `a/b/c.txt` (4 bytes)");
    assert_eq!(fixture.read("a/b/c.txt")?, "one\n");

    let output = call(&fixture, WRITE_FILE, json!({ "path": "a/b/c.txt", "content": "" })).await;
    assert_eq!(output.content, "replaced the content of `a/b/c.txt` (0 bytes)");
    assert_eq!(fixture.read("a/b/c.txt")?, "");

    let output = call(&fixture, WRITE_FILE, json!({ "path": "a", "content": "x" })).await;
    assert!(error_of(&output).starts_with("`a` is a folder, not a file"));
    Ok(())
}

#[tokio::test]
async fn write_file_refuses_content_over_the_limit() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig {
        files: FilesConfig { max_file_bytes: 10, ..FilesConfig::default() },
        ..ToolsConfig::default()
    });
    let output = registry.call(WRITE_FILE, &fixture.ctx, json!({ "path": "x.txt", "content": "12345678901" })).await;
    assert!(error_of(&output).starts_with("the content is 11 bytes, more than the 10 bytes"), "{}", error_of(&output));
    assert!(!fixture.path("x.txt").exists());
    Ok(())
}

// --- edit_file --------------------------------------------------------------------------------

#[tokio::test]
async fn edit_file_replaces_exactly_one_match() -> TestResult {
    let fixture = Fixture::new()?;
    fixture.write("notes.md", "alpha\nbeta\ngamma\n")?;
    let output =
        call(&fixture, EDIT_FILE, json!({ "path": "notes.md", "old_text": "beta\n", "new_text": "BETA\nbeta2\n" }))
            .await;
    assert_eq!(output.error, None, "{}", output.content);
    assert_eq!(output.content, "replaced the text at line 2 of `notes.md`");
    assert_eq!(fixture.read("notes.md")?, "alpha\nBETA\nbeta2\ngamma\n");
    Ok(())
}

#[tokio::test]
async fn edit_file_refuses_zero_or_several_matches_and_leaves_the_file_alone() -> TestResult {
    let fixture = Fixture::new()?;
    let original = "let a = 1;\nlet b = 2;\nlet a = 1;\n";
    fixture.write("code.rs", original)?;

    let output = call(&fixture, EDIT_FILE, json!({ "path": "code.rs", "old_text": "let c", "new_text": "x" })).await;
    assert_eq!(
        error_of(&output),
        "`old_text` does not occur in `code.rs`; read the file again and copy the text exactly, whitespace and indentation included"
    );

    let output =
        call(&fixture, EDIT_FILE, json!({ "path": "code.rs", "old_text": "let a = 1;", "new_text": "x" })).await;
    assert_eq!(
        error_of(&output),
        "`old_text` occurs 2 times in `code.rs` (at lines 1, 3); the file was not changed. Include more of the \
         surrounding text so that it matches exactly one place"
    );
    assert_eq!(fixture.read("code.rs")?, original);

    // Overlapping occurrences are ambiguous too.
    fixture.write("aaa.txt", "aaa")?;
    let output = call(&fixture, EDIT_FILE, json!({ "path": "aaa.txt", "old_text": "aa", "new_text": "b" })).await;
    assert!(error_of(&output).starts_with("`old_text` occurs 2 times"), "{}", error_of(&output));
    assert_eq!(fixture.read("aaa.txt")?, "aaa");
    Ok(())
}

#[tokio::test]
async fn edit_file_explains_other_refusals() -> TestResult {
    let fixture = Fixture::new()?;
    fixture.write("dos.txt", "one\r\ntwo\r\n")?;
    let output = call(&fixture, EDIT_FILE, json!({ "path": "dos.txt", "old_text": "one\ntwo", "new_text": "x" })).await;
    assert!(error_of(&output).contains("Windows line endings"), "{}", error_of(&output));

    let output = call(&fixture, EDIT_FILE, json!({ "path": "dos.txt", "old_text": "", "new_text": "x" })).await;
    assert!(error_of(&output).starts_with("`old_text` is empty"));
    let output = call(&fixture, EDIT_FILE, json!({ "path": "dos.txt", "old_text": "one", "new_text": "one" })).await;
    assert!(error_of(&output).contains("the same"));
    let output = call(&fixture, EDIT_FILE, json!({ "path": "new.txt", "old_text": "a", "new_text": "b" })).await;
    assert_eq!(error_of(&output), "file `new.txt` does not exist; use write_file to create it");

    std::fs::write(fixture.path("latin1.txt"), b"caf\xe9")?;
    let output = call(&fixture, EDIT_FILE, json!({ "path": "latin1.txt", "old_text": "caf", "new_text": "x" })).await;
    assert_eq!(error_of(&output), "`latin1.txt` is not UTF-8 text; edit_file edits text files only");
    Ok(())
}

// --- confinement ------------------------------------------------------------------------------

/// Every file tool, with arguments that would touch `path`.
fn attempts(path: &str) -> [(&'static str, Value); 3] {
    [
        (READ_FILE, json!({ "path": path })),
        (WRITE_FILE, json!({ "path": path, "content": "pwned\n" })),
        (EDIT_FILE, json!({ "path": path, "old_text": "outside secret", "new_text": "pwned" })),
    ]
}

async fn assert_refused_everywhere(fixture: &Fixture, registry: &Registry, path: &str, expected: &str) -> TestResult {
    for (tool, arguments) in attempts(path) {
        let output = registry.call(tool, &fixture.ctx, arguments).await;
        let error = error_of(&output);
        assert!(error.contains(expected), "{tool} {path}: `{error}` should contain `{expected}`");
        assert!(error.contains(&format!("`{path}`")), "{tool}: the error should name the path: {error}");
    }
    assert_eq!(std::fs::read_to_string(fixture.outside.join("secret.txt"))?, "outside secret\n");
    Ok(())
}

#[tokio::test]
async fn paths_cannot_escape_with_dot_dot_or_absolute_paths() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    std::fs::create_dir(fixture.path("src"))?;
    let outside_workspace = "which is outside the workspace";
    assert_refused_everywhere(&fixture, &registry, "../outside/secret.txt", outside_workspace).await?;
    assert_refused_everywhere(&fixture, &registry, "src/../../outside/secret.txt", outside_workspace).await?;
    let absolute = fixture.outside.join("secret.txt").display().to_string();
    assert_refused_everywhere(&fixture, &registry, &absolute, outside_workspace).await?;
    assert_refused_everywhere(&fixture, &registry, "/etc/hostname", outside_workspace).await?;

    // Creating a new file outside is refused too, and nothing is created.
    let output = registry.call(WRITE_FILE, &fixture.ctx, json!({ "path": "../outside/new.txt", "content": "x" })).await;
    assert!(error_of(&output).contains(outside_workspace));
    assert!(!fixture.outside.join("new.txt").exists());

    let output =
        registry.call(WRITE_FILE, &fixture.ctx, json!({ "path": "missing/../../x.txt", "content": "x" })).await;
    assert!(error_of(&output).contains("uses `..` inside a folder that does not exist"), "{}", error_of(&output));
    let output = registry.call(READ_FILE, &fixture.ctx, json!({ "path": "~/.ssh/id_ed25519" })).await;
    assert!(error_of(&output).contains("starts with `~`"));
    let output = registry.call(READ_FILE, &fixture.ctx, json!({ "path": "" })).await;
    assert!(error_of(&output).starts_with("`path` is empty"));
    Ok(())
}

#[tokio::test]
async fn paths_cannot_escape_through_symbolic_links() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    symlink(fixture.outside.join("secret.txt"), fixture.path("secret-link.txt"))?;
    symlink(&fixture.outside, fixture.path("outside-dir"))?;
    symlink(fixture.outside.join("not-yet.txt"), fixture.path("dangling.txt"))?;

    let outside_workspace = "which is outside the workspace";
    assert_refused_everywhere(&fixture, &registry, "secret-link.txt", outside_workspace).await?;
    assert_refused_everywhere(&fixture, &registry, "outside-dir/secret.txt", outside_workspace).await?;

    // A new file below a linked folder, and a write through a link to a missing file.
    let output =
        registry.call(WRITE_FILE, &fixture.ctx, json!({ "path": "outside-dir/new.txt", "content": "x" })).await;
    assert!(error_of(&output).contains(outside_workspace), "{}", error_of(&output));
    let output = registry.call(WRITE_FILE, &fixture.ctx, json!({ "path": "dangling.txt", "content": "x" })).await;
    assert!(error_of(&output).contains("symbolic link whose target does not exist"), "{}", error_of(&output));
    assert!(!fixture.outside.join("new.txt").exists());
    assert!(!fixture.outside.join("not-yet.txt").exists());
    Ok(())
}

#[tokio::test]
async fn links_inside_the_workspace_are_judged_by_what_they_name() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    fixture.write("docs/guide.md", "guide\n")?;
    symlink(fixture.path("docs"), fixture.path("docs-link"))?;
    symlink(fixture.path("docs/guide.md"), fixture.path("guide-link.md"))?;

    // A link to a folder is a folder to every tool, and nothing is written through it.
    for (tool, arguments) in attempts("docs-link") {
        let output = registry.call(tool, &fixture.ctx, arguments).await;
        assert!(error_of(&output).starts_with("`docs-link` is a folder, not a file"), "{tool}: {}", error_of(&output));
    }
    // A link to a file: read, edited and replaced through the link, which stays a link.
    let output = registry.call(READ_FILE, &fixture.ctx, json!({ "path": "guide-link.md" })).await;
    assert_eq!(output.content, "guide\n");
    let output = registry
        .call(EDIT_FILE, &fixture.ctx, json!({ "path": "guide-link.md", "old_text": "guide", "new_text": "manual" }))
        .await;
    assert_eq!(output.error, None, "{}", output.content);
    assert_eq!(fixture.read("docs/guide.md")?, "manual\n");
    let output = registry.call(WRITE_FILE, &fixture.ctx, json!({ "path": "guide-link.md", "content": "new\n" })).await;
    assert_eq!(output.content, "replaced the content of `guide-link.md` (4 bytes)");
    assert_eq!(fixture.read("docs/guide.md")?, "new\n");
    assert!(std::fs::symlink_metadata(fixture.path("guide-link.md"))?.file_type().is_symlink());
    Ok(())
}

#[tokio::test]
async fn file_tools_refuse_fifos_at_once() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let made = std::process::Command::new("mkfifo").arg(fixture.path("pipe")).status()?;
    assert!(made.success(), "mkfifo failed");
    // Opening a FIFO waits for the other end: a tool that opened it would never return.
    for (tool, arguments) in attempts("pipe") {
        let Ok(output) =
            tokio::time::timeout(std::time::Duration::from_secs(30), registry.call(tool, &fixture.ctx, arguments))
                .await
        else {
            // Free the stuck blocking thread (an open for reading and writing is both ends), so
            // that the test fails instead of its runtime waiting for that thread for good.
            drop(std::fs::OpenOptions::new().read(true).write(true).open(fixture.path("pipe")));
            return Err(format!("{tool} hung on a FIFO").into());
        };
        assert!(
            error_of(&output).starts_with("`pipe` is not a regular file (it is a FIFO, a socket or a device)"),
            "{tool}: {}",
            error_of(&output)
        );
    }
    Ok(())
}

#[tokio::test]
async fn paths_inside_the_workspace_work_however_they_are_written() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    fixture.write("docs/guide.md", "guide\n")?;
    symlink(fixture.path("docs"), fixture.path("docs-link"))?;
    let absolute = fixture.path("docs/guide.md").display().to_string();
    for path in ["docs/guide.md", "./docs/../docs/guide.md", "docs-link/guide.md", absolute.as_str()] {
        let output = registry.call(READ_FILE, &fixture.ctx, json!({ "path": path })).await;
        assert_eq!(output.content, "guide\n", "reading {path}");
    }
    // The staging folder is inside the workspace: reachable by its relative path.
    let output = registry
        .call(WRITE_FILE, &fixture.ctx, json!({ "path": ".kesoku/sessions/sess_test/scratch.txt", "content": "s" }))
        .await;
    assert_eq!(output.error, None, "{}", output.content);
    Ok(())
}

#[tokio::test]
async fn file_tools_survive_any_arguments() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let huge = "z".repeat(20_000_000);
    for tool in [READ_FILE, WRITE_FILE, EDIT_FILE] {
        let direct = registry.get(tool).ok_or("missing tool")?;
        for arguments in [
            json!(null),
            json!([1, 2]),
            json!({ "path": 7 }),
            json!({ "path": "a\u{0}b", "content": "", "old_text": "a", "new_text": "b" }),
            json!({ "path": huge, "content": "", "old_text": "a", "new_text": "b" }),
            json!({ "path": "x.txt", "content": huge, "old_text": huge, "new_text": "b" }),
        ] {
            // Through the trait directly (no schema check in front) and through the registry.
            let output = direct.call(&fixture.ctx, arguments.clone()).await;
            assert!(output.is_error(), "{tool} accepted {:.80}", arguments.to_string());
            let output = registry.call(tool, &fixture.ctx, arguments.clone()).await;
            assert!(output.is_error(), "{tool} accepted {:.80}", arguments.to_string());
        }
    }
    Ok(())
}
