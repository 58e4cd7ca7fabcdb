//! Decoding the files posted with a message (base64 in the JSON body) into the
//! [`IncomingFile`]s that [`kesoku_chatbots::ingest`] checks, names and stages.
//!
//! Everything is decoded before anything is stored or written, so a bad attachment leaves no
//! trace. Not here: file names and staging (`kesoku_chatbots::staging`); media types are
//! the client's to state.

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use kesoku_chatbots::staging::IncomingFile;

use crate::error::AppError;
use crate::views::AttachmentParams;

/// Standard alphabet; padding optional; lenient about the unused bits of the last symbol.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Decode every attachment; the first bad one fails the whole request.
pub fn decode_all(attachments: &[AttachmentParams]) -> Result<Vec<IncomingFile>, AppError> {
    attachments
        .iter()
        .enumerate()
        .map(|(index, attachment)| {
            let bytes = LENIENT_BASE64.decode(&attachment.content_base64).map_err(|error| {
                AppError::invalid_field(format!("`attachments[{index}].content_base64` is not valid base64: {error}"))
            })?;
            Ok(IncomingFile {
                filename: attachment.filename.clone(),
                mime_type: Some(attachment.mime_type.clone()),
                bytes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_lenient_about_padding() {
        assert_eq!(LENIENT_BASE64.decode("YQ").ok(), Some(b"a".to_vec()));
        assert_eq!(LENIENT_BASE64.decode("YQ==").ok(), Some(b"a".to_vec()));
        assert!(LENIENT_BASE64.decode("Y").is_err());
        assert!(LENIENT_BASE64.decode("%%%%").is_err());
    }
}
