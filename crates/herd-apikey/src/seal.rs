//! Sealing a secret under the cluster's superuser password (`herd secrets rotate --dcs`,
//! issue #42 part 4): the next passwords travel through the store encrypted with
//! ChaCha20-Poly1305 under a key derived with HKDF-SHA256 (a fixed label) from the *current*
//! superuser password, which every member holds. The sealed text is hex of a random 12-byte
//! nonce followed by the ciphertext and its 16-byte tag; opening it with another password, or
//! a text changed on the way, fails (the tag does not match).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use ring::rand::{SecureRandom, SystemRandom};

/// The HKDF label: a key for this use only, unrelated to the API key of the same password.
const INFO: &[u8] = b"herd secrets rotation v1";

/// Why a sealed text did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealError {
    /// Not hex, or shorter than a nonce and a tag.
    Malformed,
    /// Sealed under another password, or altered.
    WrongKey,
    /// The system's random source failed (sealing only).
    Random,
}

impl std::fmt::Display for SealError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SealError::Malformed => "not a sealed text",
            SealError::WrongKey => "sealed under another password (or altered)",
            SealError::Random => "the system's random source failed",
        })
    }
}

impl std::error::Error for SealError {}

fn key(password: &str) -> LessSafeKey {
    // The password is the input key material; no salt (each sealing has a random nonce).
    let prk = Salt::new(HKDF_SHA256, &[]).extract(password.as_bytes());
    let okm = prk
        .expand(&[INFO], &CHACHA20_POLY1305)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// `plain`, sealed under `password`.
pub fn seal(password: &str, plain: &[u8]) -> Result<String, SealError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Random)?;
    let mut data = plain.to_vec();
    key(password)
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
        .map_err(|_| SealError::Random)?;
    let mut out = crate::hex(&nonce);
    out.push_str(&crate::hex(&data));
    Ok(out)
}

/// What `sealed` holds, if it was sealed under `password`.
pub fn open(password: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
    let raw = crate::unhex(sealed).ok_or(SealError::Malformed)?;
    if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
        return Err(SealError::Malformed);
    }
    let (nonce, rest) = raw.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
    let mut data = rest.to_vec();
    let plain = key(password)
        .open_in_place(nonce, Aad::empty(), &mut data)
        .map_err(|_| SealError::WrongKey)?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let sealed = seal("current", b"{\"superuser\":\"next\"}").expect("seal");
        assert_eq!(
            open("current", &sealed).expect("open"),
            b"{\"superuser\":\"next\"}"
        );
        // A fresh nonce each time: the same text seals differently.
        assert_ne!(
            seal("current", b"x").expect("seal"),
            seal("current", b"x").expect("seal")
        );
        assert_eq!(open("other", &sealed), Err(SealError::WrongKey));
        // One bit changed anywhere (nonce, text, tag) is refused.
        for at in [0, 30, sealed.len() - 1] {
            let mut bytes = sealed.clone().into_bytes();
            bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
            let altered = String::from_utf8(bytes).expect("hex");
            assert_eq!(open("current", &altered), Err(SealError::WrongKey), "{at}");
        }
        for bad in ["", "zz", "abc", "00ff"] {
            assert_eq!(open("current", bad), Err(SealError::Malformed), "{bad}");
        }
    }
}
