//! Media on the iLink CDN: downloads (from the configured CDN host only, within a size cap,
//! then decrypted) and uploads (encrypted with a fresh key, announced through `getuploadurl`,
//! POSTed to the CDN, then sent as an item).
//!
//! Download URL: the item's `full_url` when the server names one, else
//! `{cdn_base_url}/download?encrypted_query_param=…`. Upload URL: `upload_full_url` from
//! `getuploadurl`, else `{cdn_base_url}/upload?encrypted_query_param=…&filekey=…`; the CDN
//! answers the upload with the download parameter in the `x-encrypted-param` header.
//!
//! Not here: deciding what to download ([`super::inbound`]) or send ([`super::outbound`]).

use md5::{Digest, Md5};
use reqwest::Url;

use super::api::{
    CdnMedia, FileItem, GetUploadUrlParams, ILinkClient, ImageItem, MessageItem, VideoItem, item_type, upload_type,
};
use super::crypto::{AesKey, CryptoError, hex, padded_size};
use crate::staging::mime_type_of;

/// Largest media downloaded or uploaded (the reference client's cap).
pub const MAX_MEDIA_BYTES: u64 = 100 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    #[error("the media item names no CDN reference (encrypt_query_param or full_url)")]
    NoReference,
    #[error("the media item has no aes_key to decrypt it with")]
    NoKey,
    #[error("the media URL's host is not the configured cdn_base_url's ({allowed}); not downloaded")]
    HostNotAllowed { allowed: String },
    #[error("the media is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },
    #[error("the CDN answered http {status}")]
    Http { status: u16 },
    #[error("the CDN could not be reached: {0}")]
    Transport(String),
    #[error("the CDN upload answer has no x-encrypted-param header")]
    NoDownloadParam,
    #[error("getuploadurl named no upload URL")]
    NoUploadUrl,
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error(transparent)]
    Api(#[from] super::api::ApiError),
}

impl MediaError {
    /// Worth trying the upload again.
    pub fn is_transient(&self) -> bool {
        match self {
            MediaError::Transport(_) => true,
            MediaError::Http { status } => *status >= 500 || *status == 429,
            MediaError::Api(error) => !matches!(error, super::api::ApiError::Permanent { .. }),
            MediaError::NoReference
            | MediaError::NoKey
            | MediaError::HostNotAllowed { .. }
            | MediaError::TooLarge { .. }
            | MediaError::NoDownloadParam
            | MediaError::NoUploadUrl
            | MediaError::Crypto(_) => false,
        }
    }
}

/// The CDN of one chatbot.
#[derive(Debug, Clone)]
pub struct Cdn {
    http: reqwest::Client,
    base_url: String,
    max_bytes: u64,
}

/// What an upload left on the CDN: enough to build the item.
#[derive(Debug, Clone)]
pub struct Uploaded {
    pub download_param: String,
    pub key: AesKey,
    pub raw_size: u64,
    pub cipher_size: u64,
    pub md5: String,
}

fn origin(url: &Url) -> (String, Option<u16>) {
    (url.host_str().unwrap_or_default().to_ascii_lowercase(), url.port_or_known_default())
}

impl Cdn {
    pub fn new(http: reqwest::Client, base_url: &str, max_bytes: u64) -> Self {
        Cdn { http, base_url: base_url.trim_end_matches('/').to_owned(), max_bytes }
    }

    /// Where `media` is downloaded from, if it is on the configured CDN host.
    pub fn download_url(&self, media: &CdnMedia) -> Result<Url, MediaError> {
        let allowed =
            Url::parse(&self.base_url).map_err(|_| MediaError::HostNotAllowed { allowed: self.base_url.clone() })?;
        let url = match (media.full_url.as_deref().filter(|u| !u.is_empty()), media.encrypt_query_param.as_deref()) {
            (Some(full), _) => Url::parse(full).map_err(|_| MediaError::NoReference)?,
            (None, Some(param)) if !param.is_empty() => {
                let mut url =
                    Url::parse(&format!("{}/download", self.base_url)).map_err(|_| MediaError::NoReference)?;
                url.query_pairs_mut().append_pair("encrypted_query_param", param);
                url
            }
            (None, Some(_) | None) => return Err(MediaError::NoReference),
        };
        if origin(&url) != origin(&allowed) || !matches!(url.scheme(), "http" | "https") {
            return Err(MediaError::HostNotAllowed { allowed: allowed.host_str().unwrap_or_default().to_owned() });
        }
        Ok(url)
    }

    /// Download `media` and decrypt it with `key`.
    pub async fn download(&self, media: &CdnMedia, key: &AesKey) -> Result<Vec<u8>, MediaError> {
        let url = self.download_url(media)?;
        let mut response =
            self.http.get(url).send().await.map_err(|error| MediaError::Transport(transport_text(&error)))?;
        if !response.status().is_success() {
            return Err(MediaError::Http { status: response.status().as_u16() });
        }
        // The ciphertext is at most one block larger than the plaintext.
        let limit = self.max_bytes + 16;
        if response.content_length().is_some_and(|length| length > limit) {
            return Err(MediaError::TooLarge { limit: self.max_bytes });
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|error| MediaError::Transport(transport_text(&error)))? {
            if (bytes.len() + chunk.len()) as u64 > limit {
                return Err(MediaError::TooLarge { limit: self.max_bytes });
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(key.decrypt(&bytes)?)
    }

    /// Encrypt `bytes` with a fresh key and put them on the CDN for `to_user`.
    pub async fn upload(
        &self,
        client: &ILinkClient,
        to_user: &str,
        bytes: &[u8],
        media_type: i64,
    ) -> Result<Uploaded, MediaError> {
        if bytes.len() as u64 > self.max_bytes {
            return Err(MediaError::TooLarge { limit: self.max_bytes });
        }
        let key = AesKey::random();
        let filekey = hex(&rand::random::<[u8; 16]>());
        let md5 = hex(&Md5::digest(bytes));
        let raw_size = bytes.len() as u64;
        let cipher_size = padded_size(raw_size);
        let params = GetUploadUrlParams {
            filekey: filekey.clone(),
            media_type,
            to_user_id: to_user.to_owned(),
            rawsize: raw_size,
            rawfilemd5: md5.clone(),
            filesize: cipher_size,
            no_need_thumb: true,
            aeskey: key.to_hex(),
        };
        let target = client.get_upload_url(&params).await?;
        let url = match (target.upload_full_url.filter(|u| !u.trim().is_empty()), target.upload_param) {
            (Some(full), _) => Url::parse(full.trim()).map_err(|_| MediaError::NoUploadUrl)?,
            (None, Some(param)) => {
                let mut url = Url::parse(&format!("{}/upload", self.base_url)).map_err(|_| MediaError::NoUploadUrl)?;
                url.query_pairs_mut().append_pair("encrypted_query_param", &param).append_pair("filekey", &filekey);
                url
            }
            (None, None) => return Err(MediaError::NoUploadUrl),
        };
        let response = self
            .http
            .post(url)
            .header("Content-Type", "application/octet-stream")
            .body(key.encrypt(bytes))
            .send()
            .await
            .map_err(|error| MediaError::Transport(transport_text(&error)))?;
        if response.status().as_u16() != 200 {
            return Err(MediaError::Http { status: response.status().as_u16() });
        }
        let download_param = response
            .headers()
            .get("x-encrypted-param")
            .and_then(|value| value.to_str().ok())
            .filter(|value| !value.is_empty())
            .ok_or(MediaError::NoDownloadParam)?
            .to_owned();
        Ok(Uploaded { download_param, key, raw_size, cipher_size, md5 })
    }
}

fn transport_text(error: &reqwest::Error) -> String {
    if error.is_timeout() { "timed out".to_owned() } else { "connection failed".to_owned() }
}

/// Which upload type and item a file of `name` is sent as.
pub fn upload_type_of(name: &str) -> i64 {
    let mime = mime_type_of(name);
    let extension = name.rsplit('.').next().unwrap_or_default().to_ascii_lowercase();
    if mime.starts_with("image/") {
        upload_type::IMAGE
    } else if matches!(extension.as_str(), "mp4" | "mov" | "m4v" | "webm") {
        upload_type::VIDEO
    } else {
        upload_type::FILE
    }
}

/// The message item announcing an upload.
pub fn item_for(uploaded: &Uploaded, media_type: i64, name: &str) -> MessageItem {
    let media = CdnMedia {
        encrypt_query_param: Some(uploaded.download_param.clone()),
        aes_key: Some(uploaded.key.to_media_key()),
        encrypt_type: Some(1),
        full_url: None,
    };
    match media_type {
        upload_type::IMAGE => MessageItem {
            item_type: item_type::IMAGE,
            image_item: Some(ImageItem { media: Some(media), aeskey: None, mid_size: Some(uploaded.cipher_size) }),
            ..MessageItem::default()
        },
        upload_type::VIDEO => MessageItem {
            item_type: item_type::VIDEO,
            video_item: Some(VideoItem { media: Some(media), video_size: Some(uploaded.cipher_size) }),
            ..MessageItem::default()
        },
        _ => MessageItem {
            item_type: item_type::FILE,
            file_item: Some(FileItem {
                media: Some(media),
                file_name: Some(name.to_owned()),
                md5: Some(uploaded.md5.clone()),
                len: Some(uploaded.raw_size.to_string()),
            }),
            ..MessageItem::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_only_from_the_configured_cdn_host() {
        let cdn = Cdn::new(reqwest::Client::new(), "https://novac2c.cdn.weixin.qq.com/c2c", MAX_MEDIA_BYTES);
        let by_param = CdnMedia { encrypt_query_param: Some("a b&c".into()), ..CdnMedia::default() };
        assert_eq!(
            cdn.download_url(&by_param).expect("allowed").as_str(),
            "https://novac2c.cdn.weixin.qq.com/c2c/download?encrypted_query_param=a+b%26c"
        );
        let elsewhere = CdnMedia { full_url: Some("https://evil.example/x".into()), ..CdnMedia::default() };
        assert!(matches!(cdn.download_url(&elsewhere), Err(MediaError::HostNotAllowed { .. })));
        let other_port =
            CdnMedia { full_url: Some("https://novac2c.cdn.weixin.qq.com:8443/x".into()), ..CdnMedia::default() };
        assert!(matches!(cdn.download_url(&other_port), Err(MediaError::HostNotAllowed { .. })));
        assert!(matches!(cdn.download_url(&CdnMedia::default()), Err(MediaError::NoReference)));
    }

    #[test]
    fn upload_types_follow_the_file_name() {
        assert_eq!(upload_type_of("chart.png"), upload_type::IMAGE);
        assert_eq!(upload_type_of("clip.mp4"), upload_type::VIDEO);
        assert_eq!(upload_type_of("report.pdf"), upload_type::FILE);
    }
}
