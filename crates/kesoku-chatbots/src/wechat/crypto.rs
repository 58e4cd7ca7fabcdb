//! The media cipher of the iLink CDN: AES-128-ECB with PKCS#7 padding, and the two encodings
//! of a media `aes_key` the API uses.
//!
//! Not here: downloading or uploading ([`super::media`]). ECB leaks equal blocks; it is what
//! the CDN speaks, not a choice of ours.

use aes::Aes128;
use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockModeDecrypt, BlockModeEncrypt, KeyInit};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

type Encryptor = ecb::Encryptor<Aes128>;
type Decryptor = ecb::Decryptor<Aes128>;

/// A 16-byte media key. Its `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct AesKey([u8; 16]);

impl std::fmt::Debug for AesKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AesKey([redacted])")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error(
        "a media aes_key must be base64 of 16 raw bytes or of a 32-character hex string; this one decodes to {len} bytes"
    )]
    KeyShape { len: usize },
    #[error("a media aes_key is not valid base64")]
    KeyBase64,
    #[error("a media aeskey is not 32 hex characters")]
    KeyHex,
    #[error("the encrypted media is {len} bytes, not a non-empty multiple of 16, or its padding is wrong: wrong key?")]
    Padding { len: usize },
}

impl AesKey {
    pub fn new(bytes: [u8; 16]) -> Self {
        AesKey(bytes)
    }

    /// A fresh random key (for uploads).
    pub fn random() -> Self {
        AesKey(rand::random())
    }

    pub fn bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parse a `CDNMedia.aes_key`: base64 of 16 raw bytes (images) or base64 of the key's 32
    /// hex characters (files, voice, video).
    pub fn from_media_key(encoded: &str) -> Result<Self, CryptoError> {
        let decoded = STANDARD.decode(encoded.trim()).map_err(|_| CryptoError::KeyBase64)?;
        match decoded.len() {
            16 => {
                let mut key = [0u8; 16];
                key.copy_from_slice(&decoded);
                Ok(AesKey(key))
            }
            32 => {
                let hex = std::str::from_utf8(&decoded).map_err(|_| CryptoError::KeyShape { len: 32 })?;
                Self::from_hex(hex).map_err(|_| CryptoError::KeyShape { len: 32 })
            }
            len => Err(CryptoError::KeyShape { len }),
        }
    }

    /// Parse 32 hex characters (`image_item.aeskey`, `getuploadurl`'s `aeskey`).
    pub fn from_hex(hex: &str) -> Result<Self, CryptoError> {
        let hex = hex.trim().as_bytes();
        if hex.len() != 32 {
            return Err(CryptoError::KeyHex);
        }
        let mut key = [0u8; 16];
        for (index, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| CryptoError::KeyHex)?;
            key[index] = u8::from_str_radix(text, 16).map_err(|_| CryptoError::KeyHex)?;
        }
        Ok(AesKey(key))
    }

    /// Lowercase hex, as `getuploadurl` takes it.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The `aes_key` of a media item sent: base64 of the hex string (what the reference
    /// client sends for images, files and video alike).
    pub fn to_media_key(&self) -> String {
        STANDARD.encode(self.to_hex())
    }

    pub fn encrypt(&self, plaintext: &[u8]) -> Vec<u8> {
        Encryptor::new(&self.0.into()).encrypt_padded_vec::<Pkcs7>(plaintext)
    }

    pub fn decrypt(&self, ciphertext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if ciphertext.is_empty() || !ciphertext.len().is_multiple_of(16) {
            return Err(CryptoError::Padding { len: ciphertext.len() });
        }
        Decryptor::new(&self.0.into())
            .decrypt_padded_vec::<Pkcs7>(ciphertext)
            .map_err(|_| CryptoError::Padding { len: ciphertext.len() })
    }
}

/// Size of the ciphertext of `plaintext_len` bytes (PKCS#7 always adds 1 to 16 bytes).
pub fn padded_size(plaintext_len: u64) -> u64 {
    (plaintext_len / 16 + 1) * 16
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
    }

    fn key(text: &str) -> AesKey {
        AesKey::from_hex(text).expect("key")
    }

    #[test]
    fn fips_197_appendix_c1() {
        let key = key("000102030405060708090a0b0c0d0e0f");
        let sealed = key.encrypt(&unhex("00112233445566778899aabbccddeeff"));
        assert_eq!(hex(&sealed[..16]), "69c4e0d86a7b0430d8cdb78070b4c55a");
        assert_eq!(sealed.len(), 32, "a full block of padding follows a whole block");
    }

    #[test]
    fn sp_800_38a_f_1_1_ecb_aes128() {
        let key = key("2b7e151628aed2a6abf7158809cf4f3c");
        let plain = unhex(concat!(
            "6bc1bee22e409f96e93d7e117393172a",
            "ae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52ef",
            "f69f2445df4f9b17ad2b417be66c3710"
        ));
        let sealed = key.encrypt(&plain);
        assert_eq!(
            hex(&sealed[..64]),
            concat!(
                "3ad77bb40d7a3660a89ecaf32466ef97",
                "f5d3d58503b9699de785895a96fdbaaf",
                "43b1cd7f598ece23881b00e3ed030688",
                "7b0c785e27e8ad3f8223207104725dd4"
            )
        );
        assert_eq!(key.decrypt(&sealed).expect("opens"), plain);
    }

    #[test]
    fn pkcs7_round_trip_with_a_fixed_key() {
        let key = AesKey::new([0x42; 16]);
        let plain = b"hello world! this is my plaintext.";
        let sealed = key.encrypt(plain);
        // RustCrypto's published ECB example for this key and text.
        assert_eq!(
            hex(&sealed),
            "42b153410851a931eb3e6c048867ae5f95eb20b42e176b07840db75688be9c70e4670ea0d87a71be5f9f3099b4fff3dc"
        );
        assert_eq!(sealed.len() as u64, padded_size(plain.len() as u64));
        assert_eq!(key.decrypt(&sealed).expect("opens"), plain);
        assert_eq!(padded_size(0), 16);
        assert_eq!(padded_size(16), 32);
        assert!(matches!(key.decrypt(&sealed[..20]), Err(CryptoError::Padding { len: 20 })));
        assert!(matches!(AesKey::new([0x43; 16]).decrypt(&sealed), Err(CryptoError::Padding { .. })));
    }

    #[test]
    fn both_media_key_encodings() {
        let key = key("00112233445566778899aabbccddeeff");
        let raw = STANDARD.encode(key.bytes());
        let of_hex = STANDARD.encode("00112233445566778899aabbccddeeff");
        assert_eq!(AesKey::from_media_key(&raw), Ok(key.clone()));
        assert_eq!(AesKey::from_media_key(&of_hex), Ok(key.clone()));
        assert_eq!(key.to_media_key(), of_hex);
        assert_eq!(AesKey::from_media_key(&STANDARD.encode([1u8; 8])), Err(CryptoError::KeyShape { len: 8 }));
        assert_eq!(AesKey::from_media_key("!!"), Err(CryptoError::KeyBase64));
        assert_eq!(format!("{key:?}"), "AesKey([redacted])");
    }
}
